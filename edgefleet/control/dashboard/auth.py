"""Who may use the dashboard: operator tokens, server-side login sessions, CSRF tokens, the Origin check, and the
throttle on failed attempts. No I/O here but the store.

- `edgefleet control token --name alice` issues a token: `eft_` + 32 random bytes. The store keeps only its
  sha256 (the token has 256 bits of entropy, so a plain hash is enough; there is nothing to salt against), with
  an optional expiry; re-issuing a name replaces its token, `--revoke NAME` ends it.
- The JSON API takes `Authorization: Bearer TOKEN`. The page's login form trades the token for a session: the
  cookie (HttpOnly, SameSite=Strict, Path=/) holds an opaque random id and nothing else; the store holds the id's
  sha256, the token's hash, the session's CSRF token and its expiry (`dashboard_sessions`). Logout revokes the
  row, so a copied cookie stops working at once; revoking or re-issuing the token ends every session made from
  it. Any control-plane instance on the same store serves the session.
- CSRF: each session has a random CSRF token of its own. The page reads it from `/api/session` (same origin only)
  and sends it as `X-CSRF-Token` on every POST; a cookie-authenticated POST without it, or with another session's,
  is refused, and so is one whose Origin is not this server's. Bearer-authenticated requests carry no ambient
  credential, so they need no CSRF token (an Origin, if sent, must still match).
- `Throttle`: failed logins and failed bearer tokens, per source address: after `FREE_FAILURES` a source's
  failures are answered 429 with Retry-After, a backoff that doubles per failure up to `MAX_BACKOFF_S`, and the
  audit trail gets one row per source per minute with the count, not one per attempt. A valid token still works
  (app.py says why).
- The source address is the TCP peer's. `X-Forwarded-For` is read only when the peer is a proxy the operator
  named (`control serve --trusted-proxy`, `client_address`): anyone else can write that header, and a throttle
  keyed on it would let each guess claim a new source (issue 32).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.cookies import SimpleCookie

from edgefleet.control.store import ApiToken, DashboardSession, Operator
from edgefleet.core.errors import UserInputError

TOKEN_PREFIX = "eft_"
COOKIE = "edgefleet_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 12 * 3600.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


class AuthError(Exception):
    """A request that is refused: `status` is 401 (who are you), 403 (not like this) or 429 (wait `retry_after`
    seconds: this source failed too often)."""

    def __init__(self, status: int, reason: str, *, retry_after: float = 0.0) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_proxies(values: Iterable[str]) -> tuple[Network, ...]:
    """The operator's `--trusted-proxy` values (an address or a network, e.g. 10.0.0.7 or 10.0.0.0/24)."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as err:
            raise UserInputError(f"--trusted-proxy {value!r} is not an IP address or network: {err}") from err
    return tuple(out)


def _trusted(address: str, proxies: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def client_address(peer: str, forwarded_for: str | None, proxies: Sequence[Network]) -> str:
    """Who a request comes from: the TCP peer, unless the peer is a trusted proxy; then the right-most address in
    `X-Forwarded-For` that is not itself a trusted proxy (the proxy appends the address it saw; whatever is to the
    left of it the client wrote, and may be anything). A malformed entry there is taken as is, never skipped."""
    if not forwarded_for or not _trusted(peer, proxies):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            return hop[:64]
    return hops[0][:64] if hops else peer


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UserInputError(f"invalid token name {name!r}: letters, digits, '.', '_', '@', '-' (at most 64)")
    return name


def issue_token(store: Operator, name: str, ttl_s: float | None = None, now: float | None = None) -> str:
    """A new secret for `name` (replacing any earlier one); only its hash is stored. Shown once."""
    now = time.time() if now is None else now
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    store.put_token(ApiToken(check_name(name), hash_token(token), now, now + ttl_s if ttl_s else None))
    return token


def authenticate(store: Operator, token: str, now: float | None = None) -> ApiToken:
    now = time.time() if now is None else now
    if not token.startswith(TOKEN_PREFIX):
        raise AuthError(401, "not an edgefleet token")
    record = store.token_by_hash(hash_token(token))
    if record is None:
        raise AuthError(401, "unknown token")
    if not record.valid(now):
        raise AuthError(401, f"token {record.name} is {'revoked' if record.revoked_at else 'expired'}")
    return record


def new_session(store: Operator, token: str, now: float | None = None) -> tuple[str, str]:
    """(cookie value, its CSRF token) for a token that authenticated: a session the store holds."""
    now = time.time() if now is None else now
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    store.put_session(DashboardSession(hash_token(session_id), hash_token(token), csrf, now, now + SESSION_TTL_S))
    return session_id, csrf


LINK_TTL_S = 300.0  # a login link's code works once, within this long
_LINK = "login-link"  # the CSRF field of a link code's row: marks it a code, never a session


def new_login_link(store: Operator, token: str, now: float | None = None) -> str:
    """A one-time code for a login link (`control token --login-url`): the link holds this code, never the
    token, so a link passed on a command line (a browser's argv, a shell history) gives away a code that ends at
    its first use or after `LINK_TTL_S`, not a live token. Kept as a short dashboard-session row marked `_LINK`."""
    now = time.time() if now is None else now
    authenticate(store, token, now)
    code = secrets.token_urlsafe(32)
    store.put_session(DashboardSession(hash_token(code), hash_token(token), _LINK, now, now + LINK_TTL_S))
    return code


def redeem_login_link(store: Operator, code: str, now: float | None = None) -> tuple[ApiToken, str, str]:
    """Trade a link's code for a session (once): (the token, cookie value, CSRF token); AuthError(401) when the
    code is unknown, used or expired."""
    now = time.time() if now is None else now
    if len(code) > 128:
        raise AuthError(401, "malformed login link")
    record = store.session(hash_token(code))
    if record is None or record.csrf != _LINK:
        raise AuthError(401, "unknown login link")
    if not record.valid(now) or not store.revoke_session(record.id_hash, now):
        raise AuthError(401, "the login link was used or expired; make a new one (edgefleet control token)")
    token = store.token_by_hash(record.token_hash)
    if token is None or not token.valid(now):
        raise AuthError(401, "the login link's token was revoked, replaced or expired")
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    store.put_session(DashboardSession(hash_token(session_id), record.token_hash, csrf, now, now + SESSION_TTL_S))
    return token, session_id, csrf


def end_session(store: Operator, cookie_header: str | None, now: float | None = None) -> bool:
    """Logout: the session of this Cookie header ends for good; False when there was none live."""
    session = session_cookie(cookie_header)
    if not session:
        return False
    return store.revoke_session(hash_token(session), time.time() if now is None else now)


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


def caller(store: Operator, authorization: str | None, cookie_header: str | None, now: float | None = None) -> Caller:
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
    if len(session) > 128:
        raise AuthError(401, "malformed session cookie; log in again")
    record = store.session(hash_token(session))
    if record is None or record.csrf == _LINK:  # a link's code is traded at /login, never a session itself
        raise AuthError(401, "unknown session; log in again")
    if not record.valid(now):
        ended = "ended at logout" if record.revoked_at else "expired"
        raise AuthError(401, f"the session {ended}; log in again")
    token = store.token_by_hash(record.token_hash)
    if token is None:
        raise AuthError(401, "the session's token was replaced; log in again")
    if not token.valid(now):
        raise AuthError(401, f"token {token.name} is {'revoked' if token.revoked_at else 'expired'}")
    return Caller(token, via_cookie=True, csrf=record.csrf)


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


FREE_FAILURES = 5  # failed attempts a source may make before it waits
MAX_BACKOFF_S = 300.0
AUDIT_WINDOW_S = 60.0  # failures of one source are summed into one audit row per window
MAX_SOURCES = 10_000  # sources tracked at once (the least recently seen are forgotten)


@dataclass
class _Source:
    failures: int = 0  # consecutive, since the last success
    blocked_until: float = 0.0
    window_start: float = 0.0
    window_count: int = 0  # failures in the current audit window not yet written
    window_reason: str = ""
    window_action: str = ""


@dataclass(frozen=True)
class AuditRow:
    """An aggregated audit row the caller writes: `count` failures of one source since `since`."""

    remote: str
    action: str
    reason: str
    count: int
    since: float


class Throttle:
    """Failed logins and bearer tokens per source address, with backoff; thread-safe; per process (each
    control-plane instance throttles what reaches it)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sources: OrderedDict[str, _Source] = OrderedDict()
        self.refused = 0  # attempts answered 429 (for /metrics)

    def _now(self) -> float:
        return self._clock()

    def wait_s(self, remote: str) -> float:
        """Seconds this source must still wait before an attempt is looked at (0: go ahead)."""
        now = self._now()
        with self._lock:
            source = self._sources.get(remote)
            wait = max(0.0, source.blocked_until - now) if source else 0.0
            if wait:
                self.refused += 1
            return wait

    def failed(self, remote: str, action: str, reason: str) -> AuditRow | None:
        """Count a failure (or an attempt refused while waiting); returns the audit row to write now, if any: the
        first failure of a source's window, or the summary of its window that just closed."""
        now = self._now()
        with self._lock:
            source = self._sources.pop(remote, None) or _Source()
            self._sources[remote] = source  # most recently seen last
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
            source.failures += 1
            if source.failures >= FREE_FAILURES:
                backoff = min(MAX_BACKOFF_S, 2.0 ** min(source.failures - FREE_FAILURES, 20))
                source.blocked_until = max(source.blocked_until, now + backoff)
            row: AuditRow | None = None
            if now - source.window_start >= AUDIT_WINDOW_S:
                if source.window_count:
                    row = AuditRow(remote, source.window_action, source.window_reason, source.window_count,
                                   source.window_start)  # fmt: skip
                source.window_start, source.window_count = now, 0
                if row is None:  # a fresh window: its first failure is written at once
                    return AuditRow(remote, action, reason, 1, now)
            source.window_action, source.window_reason = action, reason
            source.window_count += 1
            return row

    def succeeded(self, remote: str) -> None:
        with self._lock:
            source = self._sources.get(remote)
            if source is not None:
                source.failures, source.blocked_until = 0, 0.0

    def flush(self, older_than_s: float = AUDIT_WINDOW_S) -> list[AuditRow]:
        """The summaries of windows that have closed (the server writes them every few seconds)."""
        now = self._now()
        rows = []
        with self._lock:
            for remote, source in self._sources.items():
                if source.window_count and now - source.window_start >= older_than_s:
                    rows.append(AuditRow(remote, source.window_action, source.window_reason, source.window_count,
                                         source.window_start))  # fmt: skip
                    source.window_start, source.window_count = now, 0
        return rows
