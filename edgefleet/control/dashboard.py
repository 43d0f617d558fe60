"""The dashboard: a JSON API over the store and a static page that draws it and acts (no CDN, no framework).

    GET  /login, POST /login (form: token), POST /logout      a session cookie from a token
    GET  /                        the page (edgefleet/control/web/: index.html, *.js, *.css)
    GET  /api/session             who you are and this session's CSRF token
    GET  /api/fleet               every device: status, labels, latest telemetry; ingestion counters
    GET  /api/devices/ID/series   ?window=SECONDS&points=N: every stored metric over time
    GET  /api/groups, /api/groups/NAME/series                  groups, and a group's metrics over time
    GET  /api/rollouts            recent rollouts: waves, their timeline and each device's findings
    GET  /api/bundles, /api/desired, /api/audit                 published bundles, deployments, the audit trail
    GET  /api/quality             ?window=SECONDS: model quality per device and group, alerts (dashboard_quality)
    POST /api/…                   actions (edgefleet/control/dashboard_actions.py)
    GET  /healthz                 "ok" (no token needed)

Everything but /login, /healthz and the static files needs a token from `edgefleet control token`, as a bearer
header or through the login cookie; every POST is CSRF-checked (edgefleet/control/dashboard_auth.py) and lands in
the store's audit trail. The server holds no state of its own: any control-plane instance on the store serves it.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgefleet.control import dashboard_actions, dashboard_views
from edgefleet.control import dashboard_auth as auth
from edgefleet.control.dashboard_quality import api_quality
from edgefleet.control.dashboard_views import api_fleet, api_rollouts, api_series, rollout_summary
from edgefleet.control.operations import Operator, record_failure, record_refusal
from edgefleet.control.store import Store
from edgefleet.control.store_operator import AuditEntry
from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.topics import check_segment
from edgefleet.core.untrusted import safe_json

DASHBOARD_TEXT_LIMIT = 500

log = logging.getLogger(__name__)

_STATIC = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}\.(html|js|css)$")
_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
MAX_BODY = 64 * 1024
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
}

__all__ = ["DashboardServer", "api_fleet", "api_rollouts", "api_series", "rollout_summary"]


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


class _Handler(BaseHTTPRequestHandler):
    server_version = "edgefleet-dashboard"
    store: Store  # set on the subclass made per server
    secure: bool = False  # served over TLS: cookies are Secure

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard: " + format, *args)

    # --- GET
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts == ["healthz"]:
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            elif parts == ["login"]:
                self._static("login.html")
            elif len(parts) == 2 and parts[0] == "static" and _STATIC.match(parts[1]):
                self._static(parts[1])
            elif not parts:
                try:
                    self._caller()
                except auth.AuthError:
                    self._redirect("/login")
                    return
                self._static("index.html")
            elif parts[0] == "api":
                answer = _get_api(self.store, parts, parse_qs(url.query), self._caller())
                if answer is None:
                    self._json({"error": f"no such page: {url.path}"}, HTTPStatus.NOT_FOUND)
                else:
                    self._json(answer)
            else:
                self._json({"error": f"no such page: {url.path}"}, HTTPStatus.NOT_FOUND)
        except auth.AuthError as err:
            self._json({"error": err.reason}, HTTPStatus(err.status))
        except UnknownNameError as err:
            self._json({"error": str(err)}, HTTPStatus.NOT_FOUND)
        except (ValueError, UserInputError) as err:
            self._json({"error": str(err)}, HTTPStatus.BAD_REQUEST)
        except Exception as err:  # a bad query or a busy store answers 500; the server goes on
            log.exception("dashboard request %s failed", self.path)
            self._json({"error": f"{type(err).__name__}: {err}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    # --- POST
    def do_POST(self) -> None:
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        action = "login" if parts == ["login"] else "logout" if parts == ["logout"] else None
        routed = dashboard_actions.route(parts) if action is None else None
        action = action or (routed[0] if routed else None)
        target = "/".join(parts[2:]) or "-"
        if action is None:
            self._json({"error": f"no such action: {self.path}"}, HTTPStatus.NOT_FOUND)
            return
        who: auth.Caller | None = None
        try:
            body = self._body()
            if action == "login":
                self._login(body)
                return
            who = self._caller()
            auth.check_post(who, self.headers.get("Origin"), self.headers.get("Host"),
                            self.headers.get(auth.CSRF_HEADER))  # fmt: skip
            if action == "logout":
                self._redirect("/login", cookie=f"{auth.COOKIE}=; {self._cookie_flags()}; Max-Age=0")
                return
            if self.headers.get_content_type() != "application/json":
                raise UserInputError("send the action as application/json")
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise UserInputError("the body must be a JSON object")
            if routed is None:
                raise UserInputError(f"no such action: {self.path}")
            self._json(routed[1](self.store, Operator(who.actor, "dashboard", self.client_address[0]), parts, data))
        except auth.AuthError as err:
            actor = who.actor if who else "anonymous"
            record_refusal(self.store, Operator(actor, "dashboard", self.client_address[0]), action, target, err.reason)
            self._json({"error": err.reason}, HTTPStatus(err.status))
        except _TooLarge:
            self._json({"error": f"body over {MAX_BODY} bytes"}, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        except Exception as err:  # every failure of an authenticated request is in the audit trail
            if who is not None:
                operator = Operator(who.actor, "dashboard", self.client_address[0])
                record_failure(self.store, operator, action, target, err)
            if isinstance(err, UnknownNameError):
                self._json({"error": str(err)}, HTTPStatus.NOT_FOUND)
            elif isinstance(err, ValueError | UserInputError):
                self._json({"error": str(err)}, HTTPStatus.BAD_REQUEST)
            else:
                log.exception("dashboard action %s failed", self.path)
                self._json({"error": f"{type(err).__name__}: {err}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _login(self, body: bytes) -> None:
        remote = self.client_address[0]
        auth.check_origin(self.headers.get("Origin"), self.headers.get("Host"), required=True)
        token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        try:
            record = auth.authenticate(self.store, token)
        except auth.AuthError as err:
            record_refusal(self.store, Operator("anonymous", "dashboard", remote), "login", "-", err.reason)
            self._redirect("/login?failed=1")
            return
        cookie, _ = auth.new_session(token)
        self.store.add_audit(AuditEntry(time.time(), f"token:{record.name}", "login", "-", "ok", {}, "dashboard",
                                        remote))  # fmt: skip
        self._redirect("/", cookie=f"{auth.COOKIE}={cookie}; {self._cookie_flags()}; Max-Age={int(auth.SESSION_TTL_S)}")

    def _cookie_flags(self) -> str:
        return "HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if self.secure else "")

    def _caller(self) -> auth.Caller:
        return auth.caller(self.store, self.headers.get("Authorization"), self.headers.get("Cookie"))

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise _TooLarge
        return self.rfile.read(length) if length > 0 else b""

    # --- answers
    def _static(self, name: str) -> None:
        try:
            body = resources.files("edgefleet.control").joinpath("web").joinpath(name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            self._json({"error": f"no such file: {name}"}, HTTPStatus.NOT_FOUND)
            return
        self._send(HTTPStatus.OK, body, _TYPES[name.rsplit(".", 1)[1]])

    def _json(self, value: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        # Device strings (last error, event details in rollout reasons) reach the page: one line, capped.
        body = json.dumps(safe_json(value, DASHBOARD_TEXT_LIMIT), default=str).encode()
        self._send(status, body, "application/json")

    def _redirect(self, location: str, cookie: str | None = None) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", location)
        if cookie:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", "0")
        for key, value in _HEADERS.items():
            self.send_header(key, value)
        self.end_headers()

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in _HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


class _TooLarge(Exception):
    pass


class DashboardServer:
    """The HTTP server on its own thread; port 0 picks a free one (see `url`). Binds loopback unless told
    otherwise, and warns loudly when told otherwise."""

    def __init__(
        self, store: Store, host: str = "127.0.0.1", port: int = 8780, tls: tuple[str, str] | None = None
    ) -> None:
        """`tls`: (certificate chain, private key) files to serve HTTPS (cookies are then `Secure`)."""
        handler = type("Handler", (_Handler,), {"store": store, "secure": tls is not None})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(tls[0], tls[1])
            except (OSError, ssl.SSLError) as err:
                self._server.server_close()
                raise UserInputError(f"cannot use {tls[0]} and {tls[1]} for the dashboard's TLS: {err}") from err
            # The handshake happens in the request's thread (on its first read), never in the accepting loop.
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard", daemon=True)
        self.warning = auth.bind_warning(host, self._server.server_address[1], tls=tls is not None)
        if self.warning:
            log.warning("%s", self.warning)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host if isinstance(host, str) else host.decode()}:{port}/"

    def start(self) -> DashboardServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
