"""HTTP/1.1 for the local inference API: request heads, answers, and what the server asks of the application.

`Head` is a parsed request line and headers (agent/api/http/parser.py parses them); `Response` an answer, whole or
streamed (`Response.stream`: written piece by piece by a worker, chunked on HTTP/1.1);
`App.admit` decides on a request from its head alone and returns either an immediate `Response` or an `Admission`
(a handler for the body, run by a worker, and a `release` that always runs once). What a request holds while it
waits or runs (a queue place, a generation slot) is taken by `Admission.enter` only once its body is complete: a
client that trickles its body holds a socket, never a place.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

_DATE = {"second": 0, "text": ""}


@dataclass(frozen=True)
class Head:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]  # lower-case names

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


Write = Callable[[bytes], bool]  # sends one piece of a streamed answer; False once the client is gone
Stream = Callable[[Write], None]


@dataclass
class Response:
    """An answer. With `stream`, the body is not `body`: the worker that answers calls `stream(write)` once (always,
    even when the client has gone: `write` then returns False), and sends each piece as it is written, in chunked
    transfer encoding on HTTP/1.1 (on HTTP/1.0 until the connection closes). The stream holds the worker for its
    length."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    stream: Stream | None = None


@dataclass
class Admission:
    """A request accepted from its head: the worker calls `handle(body)`; `release()` runs once, whatever happened.

    `enter()`, when given, is called once the body is complete, before anything else: it takes what the request
    holds while it waits or runs (a queue place, a generation slot), or returns the refusal to answer at once (503).
    `quick()`, when given, is asked after it: True promises that `handle` will not wait (the app reserved what it
    needs), so the server may answer on its I/O thread instead of handing it to a worker.
    `body_timeout_s`: this endpoint's deadline for the whole body (None: the server's `body_timeout_s`)."""

    handle: Callable[[bytes], Response]
    release: Callable[[], None] = lambda: None
    quick: Callable[[], bool] | None = None
    enter: Callable[[], Response | None] | None = None
    body_timeout_s: float | None = None


class App(Protocol):
    def admit(self, head: Head, length: int) -> Response | Admission:
        """Decide on a request from its head alone (its body, of `length` bytes, is not read yet)."""
        ...

    def refused(self, status: int, message: str) -> Response:
        """The answer to a request the server itself refuses (a malformed head, a body over the limit)."""
        ...


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 512
    max_body_bytes: int = 8 * 2**20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    keep_alive_s: float = 30.0
    workers: int = 4


class BadHead(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def http_date() -> str:
    now = int(time.time())
    if _DATE["second"] != now:
        _DATE["text"] = formatdate(now, usegmt=True)
        _DATE["second"] = now
    return str(_DATE["text"])


_STATUS_LINES: dict[int, str] = {}


def encode(response: Response) -> bytes:
    status = _STATUS_LINES.get(response.status)
    if status is None:
        status = f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}"
        _STATUS_LINES[response.status] = status
    lines = [
        status,
        f"Date: {http_date()}",
        "Server: edgefleet-agent",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines.extend(f"{key}: {value}" for key, value in response.headers.items())
    if response.close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


def encode_stream_head(response: Response, *, chunked: bool) -> bytes:
    """The head of a streamed answer: no Content-Length; `Transfer-Encoding: chunked`, or a close-delimited body."""
    lines = [
        f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
        f"Date: {http_date()}",
        "Server: edgefleet-agent",
        f"Content-Type: {response.content_type}",
        "Cache-Control: no-cache",
    ]
    lines.extend(f"{key}: {value}" for key, value in response.headers.items())
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if response.close or not chunked:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def listen_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def listen_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock
