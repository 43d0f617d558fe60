"""The dashboard's HTTP server: uvicorn (h11) on one asyncio loop of its own thread, the requests (app.py) on a
bounded pool of worker threads.

Why uvicorn and not the standard library's ThreadingHTTPServer, which it replaces: that server gives every
connection a thread, so 1,200 idle connections held 1,200 threads and a slow client held one for as long as it
trickled bytes; bounding its threads instead turns idle connections into a denial of service. On an event loop an
idle connection costs a file descriptor and a small object, h11 parses HTTP/1.1 strictly (one Content-Length,
no obsolete line folding, bounded header size), and the store's blocking calls run on `WORKERS` threads.

What uvicorn lacks is a deadline on receiving a request: its keep-alive timeout covers the time *between*
requests and restarts on every byte, so a client sending one byte a second holds a connection for ever
(slowloris). `DeadlineH11Protocol` adds it: from the connection's start, or the end of its last answer, the whole
request (headers and body) must arrive within `REQUEST_DEADLINE_S`, or the connection is closed. The deadline is
disarmed once the request is in, so a slow store never cuts an answer short.

Limits: at most `MAX_QUEUED` requests wait for a worker (more are answered 503 with Retry-After), bodies over
`app.MAX_BODY` are refused (413) before they are read whole, and at most `MAX_CONNECTIONS` connections are kept
(uvicorn answers more with 503). Over TLS the handshake is bounded by asyncio's own timeout (60 s) before the
deadline starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard.app import MAX_BODY, Dashboard, Request, Response
from edgefleet.control.dashboard.views import api_fleet, api_rollouts, api_series, rollout_summary
from edgefleet.control.store import Store
from edgefleet.core.errors import UserInputError

REQUEST_DEADLINE_S = 10.0  # a whole request (headers and body) must arrive within this
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this
WORKERS = 8  # threads that answer requests (the store's calls block)
MAX_QUEUED = 64  # requests waiting for a worker; more are answered 503
MAX_CONNECTIONS = 4096  # open connections; uvicorn answers requests beyond it with 503
MAX_HEADER_BYTES = 16 * 1024

log = logging.getLogger(__name__)

__all__ = ["DashboardServer", "api_fleet", "api_rollouts", "api_series", "rollout_summary"]


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on receiving each whole request (see the module docstring)."""

    closed_by_deadline: Counter[str]  # set on the subclass made per server

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(REQUEST_DEADLINE_S, self._expire)

    def _disarm(self) -> None:
        handle = getattr(self, "_deadline", None)
        if handle is not None:
            handle.cancel()
        self._deadline = None

    def _request_in(self) -> bool:
        """The current request has arrived whole (its answer may still be on its way)."""
        return self.cycle is not None and not self.cycle.response_complete and not self.cycle.more_body

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_in():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection has its own deadline
            if self._request_in():  # a pipelined one was already in
                self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._request_in():
            return
        self.closed_by_deadline["request_deadline"] += 1
        self.transport.close()  # connection_lost tells h11


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in raw:
        name, text = key.decode("latin-1").lower(), value.decode("latin-1")
        if name in out:
            out[name] += ("; " if name == "cookie" else ", ") + text
        else:
            out[name] = text
    return out


class _Asgi:
    """The ASGI application: reads the request (bounded), answers it on the worker pool."""

    def __init__(
        self, dashboard: Dashboard, pool: concurrent.futures.ThreadPoolExecutor,
        proxies: tuple[auth.Network, ...] = (),
    ) -> None:  # fmt: skip
        self.dashboard, self.pool, self.proxies = dashboard, pool, proxies
        self._queued = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = _headers(scope["headers"])
        declared = headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > MAX_BODY:
            await self._send(send, Response(413, b'{"error": "body over %d bytes"}' % MAX_BODY, "application/json"),
                             close=True)  # fmt: skip
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                await self._send(send, Response(413, b'{"error": "body too large"}', "application/json"), close=True)
                return
        client = scope.get("client") or ("", 0)
        target = scope["raw_path"].decode("latin-1") + (
            "?" + scope["query_string"].decode("latin-1") if scope["query_string"] else ""
        )
        remote = auth.client_address(str(client[0]), headers.get("x-forwarded-for"), self.proxies)
        request = Request(scope["method"], target, headers, body, remote)
        with self._lock:
            if self._queued >= MAX_QUEUED + WORKERS:
                busy = True
            else:
                busy, self._queued = False, self._queued + 1
        if busy:
            response = Response(503, b'{"error": "the dashboard is busy; retry"}', "application/json",
                                [("Retry-After", "1")])  # fmt: skip
        else:
            try:
                response = await asyncio.get_running_loop().run_in_executor(self.pool, self.dashboard.handle, request)
            finally:
                with self._lock:
                    self._queued -= 1
        await self._send(send, response, head=scope["method"] == "HEAD")

    @staticmethod
    async def _send(send: Any, response: Response, *, close: bool = False, head: bool = False) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.all_headers()]
        headers.append((b"content-length", str(len(response.body)).encode()))
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else response.body})


class DashboardServer:
    """The HTTP server on its own thread; port 0 picks a free one (see `url`). Binds loopback unless told
    otherwise, and warns loudly when told otherwise."""

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 8780,
        tls: tuple[str, str] | None = None,
        *,
        local_metrics: Callable[[], Mapping[str, float]] | None = None,
        trusted_proxies: tuple[auth.Network, ...] = (),
    ) -> None:
        """`tls`: (certificate chain, private key) files to serve HTTPS (cookies are then `Secure`).
        `trusted_proxies`: the proxies whose `X-Forwarded-For` names the client (auth.client_address); from any
        other peer the header is ignored. uvicorn's own proxy-header handling (which trusts 127.0.0.1) is off.
        `local_metrics`: this process's own gauges for /metrics (the control plane's ingest backlog)."""
        self.dashboard = Dashboard(store, secure=tls is not None, local_metrics=local_metrics)
        self.closed: Counter[str] = Counter()
        self.dashboard.stats = self.closed
        protocol = type("Protocol", (DeadlineH11Protocol,), {"closed_by_deadline": self.closed})
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="dashboard")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as err:
            self._socket.close()
            raise UserInputError(f"the dashboard cannot listen on {host}:{port}: {err}") from err
        config = uvicorn.Config(
            _Asgi(self.dashboard, self._pool, trusted_proxies), http=protocol, proxy_headers=False,
            forwarded_allow_ips=[], lifespan="off", log_config=None, access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S, limit_concurrency=MAX_CONNECTIONS, backlog=2048,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES, timeout_graceful_shutdown=2, server_header=False,
            ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None,
        )  # fmt: skip
        try:
            config.load()  # reads the TLS files
        except OSError as err:
            self._socket.close()
            files = f"{tls[0]} and {tls[1]}" if tls else "no files"
            raise UserInputError(f"cannot use {files} for the dashboard's TLS: {err}") from err
        self._server = uvicorn.Server(config)
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._run, name="dashboard", daemon=True)
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="dashboard-audit", daemon=True)
        self.warning = auth.bind_warning(host, self._socket.getsockname()[1], tls=tls is not None)
        if self.warning:
            log.warning("%s", self.warning)

    def _run(self) -> None:
        self._server.run(sockets=[self._socket])

    def _flush_loop(self) -> None:
        while not self._stop.wait(5.0):
            try:
                self.dashboard.flush_audit()
            except Exception:  # a busy store: the summaries wait for the next flush
                log.exception("writing the dashboard's failure summaries failed")

    @property
    def url(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}/"

    def start(self, wait: float = 10.0) -> DashboardServer:
        self._thread.start()
        self._flusher.start()
        deadline = threading.Event()
        for _ in range(int(wait / 0.02)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.02)
        if not self._server.started:
            raise UserInputError(f"the dashboard did not start within {wait:g} s")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.should_exit = True
        self._thread.join(5)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
        self._flusher.join(5)
        try:
            self.dashboard.flush_audit(0.0)
        except Exception:
            log.exception("writing the dashboard's failure summaries failed")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._socket.close()
