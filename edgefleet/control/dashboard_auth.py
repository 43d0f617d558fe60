"""Who may use the dashboard: operator tokens, login sessions, CSRF tokens and the Origin check. No I/O here but
the store.

- `edgefleet control token --name alice` issues a token: `eft_` + 32 random bytes. The store keeps only its
  sha256 (the token has 256 bits of entropy, so a plain hash is enough; there is nothing to salt against), with
  an optional expiry; re-issuing a name replaces its token, `--revoke NAME` ends it.
- The JSON API takes `Authorization: Bearer TOKEN`. The page's login form trades the token for a session
  cookie (HttpOnly, SameSite=Strict, Path=/): `v1.ISSUED.NONCE.TOKEN`. Nothing about the session is kept in the
  web process: any control-plane instance on the same store checks it the same way, and revoking the token ends
  every session made from it.
- CSRF: a session's CSRF token is HMAC-SHA256(token, ISSUED.NONCE), so it differs per login. The page reads it
  from `/api/session` (same origin only) and sends it as `X-CSRF-Token` on every POST; a cookie-authenticated POST
  without it, or with another session's, is refused, and so is one whose Origin is not this server's.
  Bearer-authenticated requests carry no ambient credential, so they need no CSRF token (an Origin, if sent,
  must still match).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from dataclasses import dataclass
from http.cookies import SimpleCookie

from edgefleet.control.store_operator import ApiToken, OperatorStore
from edgefleet.core.errors import UserInputError

TOKEN_PREFIX = "eft_"
COOKIE = "edgefleet_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 12 * 3600.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


class AuthError(Exception):
    """A request that is refused: `status` is 401 (who are you) or 403 (not like this)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UserInputError(f"invalid token name {name!r}: letters, digits, '.', '_', '@', '-' (at most 64)")
    return name


def issue_token(store: OperatorStore, name: str, ttl_s: float | None = None, now: float | None = None) -> str:
    """A new secret for `name` (replacing any earlier one); only its hash is stored. Shown once."""
    now = time.time() if now is None else now
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    store.put_token(ApiToken(check_name(name), hash_token(token), now, now + ttl_s if ttl_s else None))
    return token


def authenticate(store: OperatorStore, token: str, now: float | None = None) -> ApiToken:
    now = time.time() if now is None else now
    if not token.startswith(TOKEN_PREFIX):
        raise AuthError(401, "not an edgefleet token")
    record = store.token_by_hash(hash_token(token))
    if record is None:
        raise AuthError(401, "unknown token")
    if not record.valid(now):
        raise AuthError(401, f"token {record.name} is {'revoked' if record.revoked_at else 'expired'}")
    return record


def _csrf(token: str, issued: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"csrf/{issued}.{nonce}".encode(), hashlib.sha256).hexdigest()


def new_session(token: str, now: float | None = None) -> tuple[str, str]:
    """(cookie value, its CSRF token) for a token that authenticated."""
    issued = str(int(time.time() if now is None else now))
    nonce = secrets.token_urlsafe(16)
    return f"v1.{issued}.{nonce}.{token}", _csrf(token, issued, nonce)


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the token's owner and how it authenticated."""

    token: ApiToken
    via_cookie: bool
    csrf: str | None = None  # the session's CSRF token (cookie sessions only)

    @property
    def actor(self) -> str:
        return f"token:{self.token.name}"


def session_cookie(header: str | None) -> str | None:
    if not header:
        return None
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie.load(header)
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = cookie.get(COOKIE)
    return morsel.value if morsel else None


def caller(
    store: OperatorStore, authorization: str | None, cookie_header: str | None, now: float | None = None
) -> Caller:
    """Who sends this request: a bearer token, else a session cookie; AuthError(401) when neither holds."""
    now = time.time() if now is None else now
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError(401, "use Authorization: Bearer TOKEN")
        return Caller(authenticate(store, value.strip(), now), via_cookie=False)
    session = session_cookie(cookie_header)
    if not session:
        raise AuthError(401, "log in first (a token from `edgefleet control token`)")
    parts = session.split(".", 3)
    if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
        raise AuthError(401, "malformed session cookie; log in again")
    _, issued, nonce, token = parts
    if now - int(issued) > SESSION_TTL_S or int(issued) > now + 300:
        raise AuthError(401, "the session expired; log in again")
    return Caller(authenticate(store, token, now), via_cookie=True, csrf=_csrf(token, issued, nonce))


def check_post(who: Caller, origin: str | None, host: str | None, csrf_header: str | None) -> None:
    """Refuse (403) a state-changing request from elsewhere, or a cookie session's POST without its CSRF token."""
    check_origin(origin, host, required=who.via_cookie)
    if who.via_cookie and (not csrf_header or not hmac.compare_digest(csrf_header, who.csrf or "")):
        raise AuthError(403, f"missing or wrong {CSRF_HEADER}")


def check_origin(origin: str | None, host: str | None, *, required: bool) -> None:
    if origin is None or origin == "":
        if required:
            raise AuthError(403, "a POST from a browser session must carry an Origin header")
        return
    if not host or origin not in (f"http://{host}", f"https://{host}"):
        raise AuthError(403, f"cross-origin request refused (Origin {origin}, this server {host})")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_warning(host: str, port: int | None, tls: bool = False) -> str | None:
    """The loud warning for a dashboard reachable from other machines, or None on loopback."""
    if is_loopback(host):
        return None
    if tls:
        return (
            f"WARNING: the dashboard listens on {host}:{port}, reachable from other machines (over TLS): anyone who "
            "can reach it and holds a token can act on the fleet. Bind 127.0.0.1 (the default) unless you mean it."
        )
    return (
        f"WARNING: the dashboard listens on {host}:{port}, reachable from other machines, over plain HTTP: "
        "tokens and session cookies cross the network in clear. Bind 127.0.0.1 (the default) and reach it through "
        "an SSH tunnel or a TLS-terminating proxy, or give it --http-cert/--http-key, unless this network is trusted."
    )
