"""The dashboard's requests and answers: one `Request` in, one `Response` out, no sockets here (server.py serves it).

    GET  /login, POST /login (form: token), POST /logout      a server-side session from a token
    GET  /login?token=TOKEN       the same session from a link (`edgefleet control token --login-url`)
    GET  /                        the page (edgefleet/control/dashboard/web/: index.html, *.js, *.css)
    GET  /api/session             who you are and this session's CSRF token
    GET  /api/fleet               every device: status, labels, latest telemetry; ingestion counters; the
                                  engine and each instance's loops (edgefleet/control/health.py)
    GET  /api/devices/ID/series   ?window=SECONDS&points=N: every stored metric over time
    GET  /api/groups, /api/groups/NAME/series                  groups, and a group's metrics over time
    GET  /api/rollouts            recent rollouts: waves, their timeline and each device's findings
    GET  /api/bundles, /api/desired, /api/audit                 published bundles, deployments, the audit trail
    GET  /api/quality             ?window=SECONDS: model quality per device and group, alerts (quality.py)
    GET  /metrics                 Prometheus text: the loops' health, ingestion counters, the server's own
    POST /api/…                   actions (edgefleet/control/dashboard/actions.py)
    GET  /healthz                 "ok" (no token needed)

Everything but /login, /healthz and the static files needs a token from `edgefleet control token`, as a bearer
header or through a login session (auth.py); every POST is CSRF-checked and lands in the store's audit trail.
Failed logins, failed bearer tokens and POSTs from nobody (no token, a dead session) are throttled per source
(auth.Throttle): once a source has failed too often its failures are answered 429 with Retry-After, and the
audit trail gets one row per source per minute instead of one per attempt. A valid token is never refused by
the throttle: tokens are 256 random bits, so the throttle is there for the cost and the noise of failures, not
for guessing, and a source shared by many (a proxy in front of the dashboard) cannot be locked out by one of
them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgefleet.control.dashboard import actions as dashboard_actions
from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard import views as dashboard_views
from edgefleet.control.dashboard.metrics import metrics_page
from edgefleet.control.dashboard.quality import api_quality
from edgefleet.control.dashboard.views import api_fleet, api_rollouts, api_series
from edgefleet.control.operations import Operator, record_failure, record_refusal
from edgefleet.control.store import AuditEntry, Store
from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.topics import check_segment
from edgefleet.core.untrusted import safe_json, safe_text

DASHBOARD_TEXT_LIMIT = 500
MAX_BODY = 64 * 1024

log = logging.getLogger(__name__)

_STATIC = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}\.(html|js|css)$")
_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
}


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # path and query, as sent
    headers: Mapping[str, str]  # lower-case names; a repeated header's values joined by ", " (cookies by "; ")
    body: bytes
    remote: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def content_type(self) -> str:
        return (self.header("content-type") or "").split(";", 1)[0].strip().lower()


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)

    def all_headers(self) -> list[tuple[str, str]]:
        out = [("Content-Type", self.content_type)] if self.content_type else []
        return out + list(self.headers) + list(_HEADERS.items())


def _json(value: Any, status: int = HTTPStatus.OK) -> Response:
    # Device strings (last error, event details in rollout reasons) reach the page: one line, capped.
    # ... and every number is finite: the answer is strict JSON (safe_json makes NaN and Infinity null).
    body = json.dumps(safe_json(value, DASHBOARD_TEXT_LIMIT), default=str, allow_nan=False).encode()
    return Response(int(status), body, "application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def _auth_error(err: auth.AuthError) -> Response:
    response = _error(err.status, err.reason)
    if err.retry_after:
        response.headers.append(("Retry-After", str(max(1, int(err.retry_after + 0.999)))))
    return response


def _redirect(location: str, cookie: str | None = None) -> Response:
    headers = [("Location", location)] + ([("Set-Cookie", cookie)] if cookie else [])
    return Response(HTTPStatus.SEE_OTHER, b"", None, headers)


def _static(name: str) -> Response:
    try:
        body = resources.files("edgefleet.control.dashboard").joinpath("web").joinpath(name).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return _error(HTTPStatus.NOT_FOUND, f"no such file: {name}")
    return Response(HTTPStatus.OK, body, _TYPES[name.rsplit(".", 1)[1]])


def _get_api(store: Store, parts: list[str], query: dict[str, list[str]], who: auth.Caller) -> Any:
    def num(key: str, default: str) -> float:
        return float(query.get(key, [default])[0])

    if parts == ["api", "session"]:
        return {"user": who.token.name, "csrf": who.csrf, "via": "cookie" if who.via_cookie else "bearer"}
    if parts == ["api", "fleet"]:
        return api_fleet(store)
    if parts == ["api", "rollouts"]:
        return api_rollouts(store)
    if parts == ["api", "groups"]:
        return dashboard_views.api_groups(store)
    if parts == ["api", "bundles"]:
        return dashboard_views.api_bundles(store)
    if parts == ["api", "desired"]:
        return dashboard_views.api_desired(store)
    if parts == ["api", "quality"]:
        return api_quality(store, num("window", "900"))
    if parts == ["api", "audit"]:
        return dashboard_views.api_audit(store, int(num("limit", "50")))
    if len(parts) == 4 and parts[1] in ("devices", "groups") and parts[3] == "series":
        name = check_segment("device id" if parts[1] == "devices" else "group", parts[2])
        window, points = num("window", "900"), int(num("points", "240"))
        if parts[1] == "devices":
            return api_series(store, name, window, points)
        return dashboard_views.api_group_series(store, name, window, points)
    return None


class Dashboard:
    """The requests of one dashboard server, over the store. `stats` is what /metrics adds of the server's own."""

    def __init__(
        self,
        store: Store,
        *,
        secure: bool = False,
        throttle: auth.Throttle | None = None,
        local_metrics: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.store, self.secure, self.local_metrics = store, secure, local_metrics
        self.throttle = throttle or auth.Throttle()
        self.stats: dict[str, int] = {}  # the HTTP server's counters (server.py), shown on /metrics

    # --- the throttle and its audit rows
    def _audit_failure(self, row: auth.AuditRow | None) -> None:
        if row is None:
            return
        outcome = f"refused: {row.reason}" if row.count == 1 else f"refused {row.count}×: {row.reason}"
        detail = {"count": row.count, "since": row.since} if row.count > 1 else {}
        self.store.add_audit(AuditEntry(time.time(), "anonymous", row.action, "-", outcome, detail, "dashboard",
                                        row.remote))  # fmt: skip

    def flush_audit(self, older_than_s: float = auth.AUDIT_WINDOW_S) -> None:
        """Write the summaries of failure windows that closed (the server calls it every few seconds, and with 0
        when it stops, so no failure goes uncounted)."""
        for row in self.throttle.flush(older_than_s):
            self._audit_failure(row)

    def _failed(self, req: Request, action: str, reason: str) -> float:
        """Count a failed login or token; returns how long the source must now wait (0: not yet throttled)."""
        self._audit_failure(self.throttle.failed(req.remote, action, reason))
        return self.throttle.wait_s(req.remote)

    @staticmethod
    def _too_many(req: Request, wait: float) -> Response:
        response = _error(HTTPStatus.TOO_MANY_REQUESTS, f"too many failed attempts from {req.remote}; retry later")
        response.headers.append(("Retry-After", str(max(1, int(wait + 0.999)))))
        return response

    def _caller(self, req: Request) -> auth.Caller:
        """Who sends this request. A wrong bearer token counts against its source like a wrong login: once the
        source has failed too often it is answered 429 with Retry-After instead of 401."""
        try:
            return auth.caller(self.store, req.header("authorization"), req.header("cookie"))
        except auth.AuthError as err:
            if req.header("authorization"):
                wait = self._failed(req, "token", err.reason)
                if wait:
                    raise auth.AuthError(429, f"too many failed attempts from {req.remote}; retry later",
                                         retry_after=wait) from err  # fmt: skip
            raise

    def _cookie_flags(self) -> str:
        return "HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if self.secure else "")

    def _session_cookie(self, value: str, max_age: int) -> str:
        return f"{auth.COOKIE}={value}; {self._cookie_flags()}; Max-Age={max_age}"

    # --- the entry point
    def handle(self, req: Request) -> Response:
        if req.method in ("GET", "HEAD"):
            response = self._get(req)
        elif req.method == "POST":
            response = self._post(req)
        else:
            response = _error(HTTPStatus.METHOD_NOT_ALLOWED, f"method {safe_text(req.method, 20)} not allowed")
            response.headers.append(("Allow", "GET, HEAD, POST"))
        return response

    def _get(self, req: Request) -> Response:
        url = urlsplit(req.target)
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts == ["healthz"]:
                return Response(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            if parts == ["login"] and "code" in parse_qs(url.query):
                return self._login_code(req, parse_qs(url.query)["code"][0])
            if parts == ["login"] and "token" in parse_qs(url.query):
                return self._login_link(req, parse_qs(url.query)["token"][0])
            if parts == ["login"]:
                return _static("login.html")
            if len(parts) == 2 and parts[0] == "static" and _STATIC.match(parts[1]):
                return _static(parts[1])
            if not parts:
                try:
                    auth.caller(self.store, None, req.header("cookie"))
                except auth.AuthError:
                    return _redirect("/login")
                return _static("index.html")
            if parts == ["metrics"]:
                self._caller(req)
                local = self.local_metrics() if self.local_metrics else {}
                body, content_type = metrics_page(self.store, self.stats, self.throttle.refused, local)
                return Response(HTTPStatus.OK, body, content_type)
            if parts[0] == "api":
                answer = _get_api(self.store, parts, parse_qs(url.query), self._caller(req))
                if answer is None:
                    return _error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
                return _json(answer)
            return _error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
        except auth.AuthError as err:
            return _auth_error(err)
        except UnknownNameError as err:
            return _error(HTTPStatus.NOT_FOUND, str(err))
        except (ValueError, UserInputError) as err:
            return _error(HTTPStatus.BAD_REQUEST, str(err))
        except Exception as err:  # a bad query or a busy store answers 500; the server goes on
            log.exception("dashboard request %s failed", safe_text(req.target, 200))
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(err).__name__}: {err}")

    def _post(self, req: Request) -> Response:
        parts = [p for p in urlsplit(req.target).path.split("/") if p]
        action = "login" if parts == ["login"] else "logout" if parts == ["logout"] else None
        routed = dashboard_actions.route(parts) if action is None else None
        action = action or (routed[0] if routed else None)
        target = "/".join(parts[2:]) or "-"
        if action is None:
            return _error(HTTPStatus.NOT_FOUND, f"no such action: {safe_text(req.target, 200)}")
        if len(req.body) > MAX_BODY:
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
        who: auth.Caller | None = None
        try:
            if action == "login":
                return self._login(req)
            who = self._caller(req)
            auth.check_post(who, req.header("origin"), req.header("host"), req.header(auth.CSRF_HEADER))
            if action == "logout":
                auth.end_session(self.store, req.header("cookie"))
                self.store.add_audit(AuditEntry(time.time(), who.actor, "logout", "-", "ok", {}, "dashboard",
                                                req.remote))  # fmt: skip
                return _redirect("/login", cookie=self._session_cookie("", 0))
            if req.content_type != "application/json":
                raise UserInputError("send the action as application/json")
            data = json.loads(req.body or b"{}")
            if not isinstance(data, dict):
                raise UserInputError("the body must be a JSON object")
            if routed is None:
                raise UserInputError(f"no such action: {req.target}")
            return _json(routed[1](self.store, Operator(who.actor, "dashboard", req.remote), parts, data))
        except auth.AuthError as err:
            if who is not None:  # an operator's refused request (no CSRF token, another origin): one row each
                record_refusal(self.store, Operator(who.actor, "dashboard", req.remote), action, target, err.reason)
            elif not req.header("authorization"):  # nobody: counted and audited once a minute (a bad bearer token
                wait = self._failed(req, action, err.reason)  # already was, by _caller)
                if wait:
                    return self._too_many(req, wait)
            return _auth_error(err)
        except Exception as err:  # every failure of an authenticated request is in the audit trail
            if who is not None:
                record_failure(self.store, Operator(who.actor, "dashboard", req.remote), action, target, err)
            if isinstance(err, UnknownNameError):
                return _error(HTTPStatus.NOT_FOUND, str(err))
            if isinstance(err, ValueError | UserInputError):
                return _error(HTTPStatus.BAD_REQUEST, str(err))
            log.exception("dashboard action %s failed", safe_text(req.target, 200))
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(err).__name__}: {err}")

    def _login(self, req: Request) -> Response:
        auth.check_origin(req.header("origin"), req.header("host"), required=True)
        token = (parse_qs(req.body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        return self._start_session(req, token, {})

    def _login_link(self, req: Request, token: str) -> Response:
        """`GET /login?token=…` (`edgefleet control token --login-url`): the same session as the form's, for a
        browser or a headless screenshot opened from a shell. Refused when another site sent the browser here
        (Sec-Fetch-Site), so no page can log a visitor in under a token of its choosing."""
        if (req.header("sec-fetch-site") or "none") not in ("none", "same-origin"):
            record_refusal(self.store, Operator("anonymous", "dashboard", req.remote), "login", "-", "cross-site link")
            return _error(HTTPStatus.FORBIDDEN, "a login link works when opened directly, not from another site")
        return self._start_session(req, token.strip(), {"via": "link"})

    def _login_code(self, req: Request, code: str) -> Response:
        """`GET /login?code=…` (`edgefleet control token --login-url`): a one-time code, not the token, so the link
        is harmless once used (auth.new_login_link). Refused from another site, as `_login_link` is."""
        if (req.header("sec-fetch-site") or "none") not in ("none", "same-origin"):
            record_refusal(self.store, Operator("anonymous", "dashboard", req.remote), "login", "-", "cross-site link")
            return _error(HTTPStatus.FORBIDDEN, "a login link works when opened directly, not from another site")
        try:
            record, session, _ = auth.redeem_login_link(self.store, code.strip())
        except auth.AuthError as err:
            wait = self._failed(req, "login", err.reason)
            return self._too_many(req, wait) if wait else _redirect("/login?failed=1")
        self.throttle.succeeded(req.remote)
        self.store.add_audit(AuditEntry(time.time(), f"token:{record.name}", "login", "-", "ok", {"via": "link"},
                                        "dashboard", req.remote))  # fmt: skip
        return _redirect("/", cookie=self._session_cookie(session, int(auth.SESSION_TTL_S)))

    def _start_session(self, req: Request, token: str, detail: dict[str, str]) -> Response:
        try:
            record = auth.authenticate(self.store, token)
        except auth.AuthError as err:
            wait = self._failed(req, "login", err.reason)
            return self._too_many(req, wait) if wait else _redirect("/login?failed=1")
        self.throttle.succeeded(req.remote)
        session, _ = auth.new_session(self.store, token)
        self.store.add_audit(AuditEntry(time.time(), f"token:{record.name}", "login", "-", "ok", detail, "dashboard",
                                        req.remote))  # fmt: skip
        return _redirect("/", cookie=self._session_cookie(session, int(auth.SESSION_TTL_S)))
