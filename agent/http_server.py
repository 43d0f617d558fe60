"""The HTTP/1.1 side of the local inference API: a small reader of our own on socketserver (keep-alive,
Content-Length bodies), because http.server's header parsing doubled the overhead per request."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import socketserver
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from edgefleet.agent.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgefleet.agent.wire import JSON, RequestError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from edgefleet.agent.service import InferenceService

_INFER = re.compile(r"^/v1/models/([A-Za-z0-9._-]{1,64})/infer$")
_MODEL = re.compile(r"^/v1/models/([A-Za-z0-9._-]{1,64})$")
_FEEDBACK = re.compile(r"^/v1/models/([A-Za-z0-9._-]{1,64})/feedback$")


class _BadHead(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class _Head:
    method: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


_MAX_LINE = 8192
_MAX_HEADERS = 64
_DATE = {"second": 0, "text": ""}


def _http_date() -> str:
    now = int(time.time())
    if _DATE["second"] != now:
        _DATE["text"] = formatdate(now, usegmt=True)
        _DATE["second"] = now
    return str(_DATE["text"])


class RequestHandler(socketserver.StreamRequestHandler):
    """One keep-alive connection: a lean HTTP/1.1 reader (request line, headers, Content-Length body).

    http.server's handler parses headers with the email package and writes headers and body separately;
    at a few tens of microseconds per inference that doubled the API's overhead, hence this small reader.
    """

    service: InferenceService

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls
        with self.service._connections_lock:
            self.service._connections.add(self.connection)

    def finish(self) -> None:
        with self.service._connections_lock:
            self.service._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def handle(self) -> None:
        while True:
            try:
                head = self._read_head()
            except _BadHead as err:
                self.service.metrics.error("bad-request")
                self.service.metrics.requests.inc("-", str(err.status))
                body = json.dumps({"error": {"kind": "bad-request", "message": err.message}}).encode()
                with contextlib.suppress(OSError):
                    self._send(err.status, body, JSON, close=True)
                return
            except (OSError, ValueError):  # timeout, reset, or a closed connection
                return
            if head is None:
                return
            try:
                keep = self._dispatch(head) and head.keep_alive
            except OSError:
                return
            if not keep:
                return

    def _read_head(self) -> _Head | None:
        line = self.rfile.readline(_MAX_LINE + 1)
        while line in (b"\r\n", b"\n"):  # RFC 9112: ignore empty lines before a request line
            line = self.rfile.readline(_MAX_LINE + 1)
        if not line:
            return None
        if len(line) > _MAX_LINE:
            raise _BadHead(414, "request line too long")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[1].startswith("/"):
            raise _BadHead(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadHead(505, f"{version} is not supported; use HTTP/1.1")
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                raise _BadHead(431, "header line too long")
            if line in (b"\r\n", b"\n", b""):
                return _Head(method, target.split("?", 1)[0], version, headers)
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():
                raise _BadHead(400, "malformed header line")
            headers[name.lower()] = value.strip()
        raise _BadHead(431, f"more than {_MAX_HEADERS} headers")

    # --- routing; returns whether the connection may be reused
    def _dispatch(self, head: _Head) -> bool:
        if head.method == "POST":
            return self._post(head)
        if head.method != "GET":
            reusable = self._discard_body(head)
            self._error(RequestError(405, "bad-request", f"method {head.method} not allowed"), allow="GET, POST",
                        close=not reusable)  # fmt: skip
            return reusable
        service, path = self.service, head.path
        if path == "/metrics":
            self._send(200, service.metrics.exposition().encode(), METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            models = service.models()
            self._json(200, {"status": "ok" if models else "no-model", "models": sorted(models)})
        elif path == "/v1/models":
            self._json(200, {"models": [service.describe(m) for _, m in sorted(service.models().items())]})
        elif match := _MODEL.match(path):
            model = service.models().get(match.group(1))
            if model is None:
                self._error(RequestError(404, "not-found", f"no model named {match.group(1)!r} is served here"))
            else:
                self._json(200, service.describe(model))
        elif _INFER.match(path):
            self._error(RequestError(405, "bad-request", "use POST for inference"), allow="POST")
        else:
            self._error(RequestError(404, "not-found", f"no such endpoint {path}"))
        return True

    def _post(self, head: _Head) -> bool:
        if feedback := _FEEDBACK.match(head.path):
            return self._feedback(head, feedback.group(1))
        match = _INFER.match(head.path)
        if match is None:
            reusable = self._discard_body(head)
            self._error(
                RequestError(404, "not-found", f"no such endpoint {head.path} (POST /v1/models/NAME/infer)"),
                close=not reusable,
            )
            return reusable
        name = match.group(1)
        try:
            body = self._read_body(head)
        except RequestError as err:
            self._error(err, model=name, close=True)  # the body was not read: the connection is unusable
            return False
        try:
            payload, kind, headers = self.service.infer(
                name, body, head.headers.get("content-type", JSON), head.headers.get("accept", "")
            )
        except RequestError as err:
            self._error(err, model=name)
            return True
        self.service.metrics.requests.inc(name, "200")
        self._send(200, payload, kind, headers)
        return True

    def _feedback(self, head: _Head, name: str) -> bool:
        try:
            body = self._read_body(head)
        except RequestError as err:
            self._error(err, model=name, close=True)
            return False
        try:
            document = self.service.feedback(name, body)
        except RequestError as err:
            self._error(err, model=name)
            return True
        self._json(200, document)
        return True

    # --- bodies and answers
    def _read_body(self, head: _Head) -> bytes:
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            raise RequestError(411, "bad-request", "chunked bodies are not accepted; send Content-Length")
        length_text = head.headers.get("content-length")
        if length_text is None:
            raise RequestError(411, "bad-request", "Content-Length is required")
        if not length_text.isdigit():
            raise RequestError(400, "bad-request", f"Content-Length {length_text!r} is not a number")
        length, limit = int(length_text), self.service.config.max_body_bytes
        if length > limit:
            raise RequestError(413, "too-large", f"request body of {length} bytes exceeds the limit of {limit} bytes")
        body = self.rfile.read(length)
        if len(body) != length:
            raise RequestError(400, "bad-request", f"body ended after {len(body)} of {length} bytes")
        return body

    def _discard_body(self, head: _Head) -> bool:
        """Skip a body we do not use; False when it cannot be skipped (the connection must close)."""
        length_text = head.headers.get("content-length", "0")
        if "transfer-encoding" in head.headers or not length_text.isdigit():
            return False
        length = int(length_text)
        if length > self.service.config.max_body_bytes:
            return False
        return len(self.rfile.read(length)) == length

    def _json(self, status: int, document: Any) -> None:
        self._send(status, json.dumps(document).encode(), JSON)

    def _error(self, err: RequestError, *, model: str = "-", allow: str | None = None, close: bool = False) -> None:
        metrics = self.service.metrics
        metrics.error(err.kind)
        metrics.requests.inc(model, str(err.status))
        headers = {"Allow": allow} if allow else {}
        if err.status == 503:
            headers["Retry-After"] = "1"
        body = json.dumps({"error": {"kind": err.kind, "message": err.message}}).encode()
        self._send(err.status, body, JSON, headers, close=close)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        close: bool = False,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Date: {_http_date()}",
            "Server: edgefleet-agent",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{key}: {value}" for key, value in (headers or {}).items())
        if close:
            lines.append("Connection: close")
        self.connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)  # one write


class TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class TCPServer6(TCPServer):
    address_family = socket.AF_INET6


class UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False
