"""The HTTP/1.1 side of the local inference API: one I/O thread and a bounded pool of workers.

The I/O thread owns every idle or half-read connection: it accepts, reads request heads and bodies without
blocking, and enforces the limits (connections, head size, head and body deadlines). A request is admitted
(`App.admit`) as soon as its head is complete and BEFORE its body is read: a refusal (401, 403, 404, 413, ...) is
answered at once and the body is never read. The request takes its place (a queue place, a generation slot:
`Admission.enter`) only once its body is complete, so a client that trickles its body holds a socket and nothing
else; a full service refuses it then (503). A complete request is handed, whole, to a worker of a fixed pool;
the worker answers it (with a send deadline) and gives the connection back. So a thousand slow clients cost a
thousand sockets and a few bytes each, never a thread each, and can never starve the workers.

An answer may be streamed (`Response.stream`, e.g. server-sent events of a generation): the worker sends the head,
then each piece as the app writes it (chunked on HTTP/1.1), each within the send deadline; a client that goes away
is seen at the next write, which then returns False. A stream holds its worker for its whole length.

One exception saves a thread wake-up per request where it counts, for small fast models: a request whose body is
complete and small (QUICK_BODY_MAX) and that the app calls quick (`Admission.quick`: the service is otherwise idle,
the model's last run took under a millisecond and an inference slot is reserved for it) is answered on the I/O
thread itself, but only while no other client is seen: no other connection with bytes unread at that moment, and
none for CROWD_S before. Without that rule concurrent clients were served one at a time: while the I/O thread
runs a model, the others' requests wait unread in their sockets, so the service looks idle to each in turn and the
workers stay idle (py-spy, 4 clients of a 0.25 ms MLP: 84 % of the server's samples on the I/O thread, most of them
in the model). The I/O thread still never waits on a peer: an answer the socket cannot take at once is finished by
a worker.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from edgefleet.agent.api.error_log import SampledLog
from edgefleet.agent.api.http.chunked import LAST_CHUNK, chunk
from edgefleet.agent.api.http.connection import BODY, BUSY, HEAD, IDLE, Conn, send_rest, send_some
from edgefleet.agent.api.http.parser import read_request
from edgefleet.agent.api.http.protocol import App, BadHead, Response, ServerLimits, encode, encode_stream_head

log = logging.getLogger(__name__)

QUICK_BODY_MAX = 64 * 1024  # a larger body is decoded by a worker, whatever the app says
CROWD_S = 0.05  # after a sign of another client, requests go to the workers for this long (no quick answers)


def _has_data(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:  # BlockingIOError included: nothing after all
        return False


class HttpServer:
    """Serves `app` on a bound, listening socket until `stop()`."""

    def __init__(
        self, listener: socket.socket, app: App, limits: ServerLimits, on_close: Callable[[str], None] | None = None
    ) -> None:
        """`on_close(reason)` is told of every connection the server closes, and why (for metrics)."""
        self.listener, self.app, self.limits, self._on_close = listener, app, limits, on_close
        listener.setblocking(False)
        self._tcp = listener.family in (socket.AF_INET, socket.AF_INET6)
        self._selector = selectors.DefaultSelector()
        self._selector_lock = threading.RLock()
        self._conns: dict[int, Conn] = {}
        self._conns_lock = threading.Lock()
        self._returned: deque[Conn] = deque()
        self._rbuf = bytearray(262144)  # the I/O thread's receive buffer
        self._rview = memoryview(self._rbuf)
        self._waker_r, self._waker_w = socket.socketpair()
        self._waker_r.setblocking(False)
        self._waker_w.setblocking(False)
        self._jobs: queue.SimpleQueue[Conn | Callable[[], None] | None] = queue.SimpleQueue()
        self._workers = [
            threading.Thread(target=self._worker, name=f"inference-api-{i}", daemon=True) for i in range(limits.workers)
        ]
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._crowded_until = 0.0  # no quick answers before this (monotonic): other clients were seen
        self._errors = SampledLog(log)  # a traceback per kind at most once a minute, the rest counted

    # --- lifecycle
    def start(self) -> HttpServer:
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self._selector.register(self._waker_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="inference-api-io", daemon=True)
        self._thread.start()
        for worker in self._workers:
            worker.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(5)
        for _ in self._workers:
            self._jobs.put(None)
        with self._conns_lock:
            conns = list(self._conns.values())
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
            self._close(conn, "stopped")
        with contextlib.suppress(OSError):
            self.listener.close()
        for sock in (self._waker_r, self._waker_w):
            sock.close()
        self._selector.close()

    def open_connections(self) -> int:
        return len(self._conns)

    # --- the I/O thread
    def _loop(self) -> None:
        next_sweep = 0.0
        while not self._stopping.is_set():
            try:
                events = self._selector.select(0.25)
            except OSError:  # a socket closed under the selector by a worker: select again
                continue
            for key, _ in events:
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        while self._waker_r.recv(4096):
                            pass
                else:
                    self._readable(key.data)
            while self._returned:
                self._resume(self._returned.popleft())
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + 0.25

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors: leave the rest in the backlog for now
                log.warning("accept failed: %s", err)
                return
            if len(self._conns) >= self.limits.max_connections and not self._evict_oldest():
                self._count("over-limit")
                sock.close()
                continue
            sock.setblocking(False)
            if self._tcp:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls
            conn = Conn(sock, time.monotonic(), self.limits.keep_alive_s)
            with self._conns_lock:
                self._conns[conn.fd] = conn
            self._register(conn)

    def _evict_oldest(self) -> bool:
        """At the connection limit, the connection idle (or stuck in its head or body) the longest makes room: a body
        still arriving holds no place (Admission.enter), so closing it frees only a socket."""
        with self._conns_lock:
            waiting = [c for c in self._conns.values() if c.state in (IDLE, HEAD, BODY)]
        if not waiting:
            return False
        self._close(min(waiting, key=lambda c: c.last), "evicted")
        return True

    def _readable(self, conn: Conn) -> None:
        with self._selector_lock:
            if conn.state == BUSY:  # a pipelined request while a worker answers: read it once it is done
                self._unregister(conn)
                return
        try:  # into one preallocated buffer: recv(n) would allocate (and page in) n bytes on every call
            count = conn.sock.recv_into(self._rbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, "reset")
            return
        if not count:
            self._close(conn, "peer-closed")
            return
        data = self._rview[:count].tobytes()
        now = time.monotonic()
        conn.last = now
        if conn.state == BODY:
            self._take_body(conn, data)
            return
        if conn.state == IDLE:
            conn.state, conn.deadline = HEAD, now + self.limits.header_timeout_s
        conn.buf += data
        self._parse(conn)

    def _parse(self, conn: Conn) -> None:
        try:  # strict (agent/api/http/parser.py); a refusal closes the connection: what follows is never a request
            parsed = read_request(conn.buf, self.limits.max_body_bytes)
        except BadHead as err:
            conn.buf.clear()
            self._refuse(conn, err.status, err.message)
            return
        if parsed is None:
            return
        head, length = parsed.head, parsed.length
        del conn.buf[: parsed.consumed]
        try:
            decision = self.app.admit(head, length)
        except Exception:  # the app must answer; never let one request take the I/O thread down
            self._errors.exception("admit", "admission failed for %s %s", head.method, head.path)
            decision = self.app.refused(500, "internal error while admitting the request")
        if isinstance(decision, Response):
            # The body was not read: the connection can only be reused when there is no body to skip.
            decision.close = decision.close or length > 0 or not head.keep_alive
            self._answer_now(conn, decision)
            return
        conn.head, conn.admission, conn.state = head, decision, BODY
        body_timeout = decision.body_timeout_s if decision.body_timeout_s is not None else self.limits.body_timeout_s
        conn.deadline = time.monotonic() + body_timeout
        conn.body = bytearray()  # grows with what arrives: a declared length costs nothing until it is sent
        conn.got = length  # here: the body's declared length
        leftover = bytes(conn.buf)
        conn.buf.clear()
        self._take_body(conn, leftover)

    def _take_body(self, conn: Conn, data: bytes) -> None:
        need = conn.got - len(conn.body)
        if data:
            conn.body += data[:need]
            if len(data) > need:
                conn.buf += data[need:]  # a pipelined next request
        if len(conn.body) < conn.got:
            return
        if not self._enter(conn):
            return
        conn.state = BUSY  # it stays registered: a worker answers, and no epoll_ctl is needed per request
        if conn.got <= QUICK_BODY_MAX and self._quick(conn):
            self._answer_quick(conn)
            return
        self._jobs.put(conn)

    def _enter(self, conn: Conn) -> bool:
        """The body is complete: the request takes its place now (`Admission.enter`), or is refused at once."""
        admission, head = conn.admission, conn.head
        if admission is None or admission.enter is None or head is None:
            return True
        try:
            refusal = admission.enter()
        except Exception:  # the app must answer; never let one request take the I/O thread down
            self._errors.exception("enter", "taking a place failed for %s %s", head.method, head.path)
            refusal = self.app.refused(500, "internal error while admitting the request")
        if refusal is None:
            return True
        conn.admission, conn.head, conn.body = None, None, bytearray()
        admission.release()
        refusal.close = refusal.close or not head.keep_alive
        self._answer_now(conn, refusal)
        return False

    def _quick(self, conn: Conn) -> bool:
        quick = conn.admission.quick if conn.admission is not None else None
        if quick is None:
            return False
        try:
            ok = quick()
        except Exception:  # a worker answers it then
            self._errors.exception("quick", "quick admission check failed")
            return False
        # The app's check first (it is cheaper); a slot it reserved stays with the request when a worker answers it.
        return ok and not self._crowded()

    def _crowded(self) -> bool:
        """Whether another client may be waiting: one was seen within CROWD_S, or another connection (not one a
        worker holds) has bytes unread now (a zero-timeout poll, then a peek: a connection its client closed is
        readable too, and is no client). A request left unread while the I/O thread ran a model would wait for it,
        and each next request would find the service idle again."""
        now = time.monotonic()
        if now < self._crowded_until:
            return True
        try:
            ready = self._selector.select(0)
        except OSError:
            ready = []
        for key, _ in ready:
            other = key.data
            if isinstance(other, Conn) and other.state != BUSY and _has_data(other.sock):
                self._crowded_until = now + CROWD_S
                return True
        return False

    def _answer_quick(self, conn: Conn) -> None:
        """Answer a request the app called quick here on the I/O thread: one thread wake fewer than a worker. An
        answer the peer cannot take at once is finished by a worker (the I/O thread never waits on a peer)."""
        response = self._respond(conn)
        data = encode(response)
        now = time.monotonic()
        sent = send_some(conn.sock, data)
        if sent == len(data) and not response.close:
            conn.state, conn.last, conn.deadline = IDLE, now, now + self.limits.keep_alive_s
            if conn.buf:  # pipelined requests: parsed by the loop (not from here: no recursion)
                self._returned.append(conn)
            return
        self._jobs.put(lambda: self._after_send(conn, data, sent, response.close, now))

    def _answer_now(self, conn: Conn, response: Response) -> None:
        """A short answer from the I/O thread; a peer that cannot take it at once loses the connection."""
        data = encode(response)
        try:
            sent = conn.sock.send(data)
        except OSError:
            sent = -1
        if sent != len(data) or response.close:
            self._close(conn, "refused")
            return
        conn.state, conn.deadline = IDLE, time.monotonic() + self.limits.keep_alive_s
        if conn.buf:
            self._parse(conn)

    def _refuse(self, conn: Conn, status: int, message: str) -> None:
        response = self.app.refused(status, message)
        response.close = True
        self._answer_now(conn, response)

    def _sweep(self, now: float) -> None:
        with self._conns_lock:
            late = [c for c in self._conns.values() if c.state != BUSY and c.deadline <= now]
        for conn in late:
            reason = {IDLE: "keep-alive-timeout", HEAD: "header-timeout", BODY: "body-timeout"}[conn.state]
            if conn.state == BODY:
                admission, conn.admission = conn.admission, None
                if admission is not None:  # its place is free before the client hears why
                    admission.release()
                with contextlib.suppress(OSError):  # tell a merely slow client why; never wait for it
                    response = self.app.refused(408, "the request body did not arrive in time")
                    response.close = True
                    conn.sock.send(encode(response))
            self._close(conn, reason)

    # --- workers
    def _worker(self) -> None:
        while (job := self._jobs.get()) is not None:
            if isinstance(job, Conn):
                self._work(job)
            else:
                job()

    def _respond(self, conn: Conn) -> Response:
        admission, body = conn.admission, bytes(conn.body) if len(conn.body) else b""
        head = conn.head
        conn.admission, conn.body, conn.head = None, bytearray(), None
        assert admission is not None and head is not None
        try:
            response = admission.handle(body)
        except Exception:  # handlers answer every error themselves; this is the last line of defence
            self._errors.exception("handle", "request %s %s failed", head.method, head.path)
            response = self.app.refused(500, "internal error")
        finally:
            admission.release()
        response.close = response.close or not head.keep_alive or self._stopping.is_set()
        return response

    def _work(self, conn: Conn) -> None:
        chunked = conn.head is None or conn.head.version != "HTTP/1.0"
        response = self._respond(conn)
        if response.stream is not None:
            self._stream(conn, response, chunked)
            return
        data = encode(response)
        now = time.monotonic()
        with self._selector_lock:  # the I/O thread cannot see this connection between the send and IDLE
            sent = send_some(conn.sock, data)
            if sent == len(data) and not response.close and not conn.buf and conn.registered:
                conn.state, conn.last, conn.deadline = IDLE, now, now + self.limits.keep_alive_s
                return  # the common case: one send, no selector change
        self._after_send(conn, data, sent, response.close, now)

    def _stream(self, conn: Conn, response: Response, chunked: bool) -> None:
        """On a worker: a streamed answer, piece by piece; the app's `stream` is called even when the client is gone
        (its writes then return False), so that what it holds is always released."""
        assert response.stream is not None
        response.close = response.close or not chunked or self._stopping.is_set()
        timeout = self.limits.send_timeout_s
        head = encode_stream_head(response, chunked=chunked)
        alive = [send_rest(conn.sock, head, 0, time.monotonic() + timeout)]

        def write(data: bytes) -> bool:
            if alive[0] and data:
                framed = chunk(data) if chunked else data
                sent = send_some(conn.sock, framed)  # the common case: the socket takes it at once
                if sent != len(framed):
                    alive[0] = sent >= 0 and send_rest(conn.sock, framed, sent, time.monotonic() + timeout)
            return alive[0]

        try:
            response.stream(write)
        except Exception:  # the app ends its own stream on errors; this is the last line of defence
            self._errors.exception("stream", "a streamed answer failed")
            alive[0] = False
        if alive[0] and chunked:
            alive[0] = send_rest(conn.sock, LAST_CHUNK, 0, time.monotonic() + timeout)
        self._after_send(conn, b"", 0 if alive[0] else -1, response.close, time.monotonic())

    def _after_send(self, conn: Conn, data: bytes, sent: int, close: bool, now: float) -> None:
        """On a worker: the rest of an answer (waiting for a slow peer), then the connection back to the I/O thread."""
        if sent < 0 or not send_rest(conn.sock, data, max(sent, 0), now + self.limits.send_timeout_s):
            self._close(conn, "send-failed")
            return
        if close:
            self._close(conn, "closed")
            return
        with self._selector_lock:
            conn.state, conn.last, conn.deadline = IDLE, now, now + self.limits.keep_alive_s
        self._returned.append(conn)  # the I/O thread registers it again and parses what is already buffered
        self._wake()

    def _resume(self, conn: Conn) -> None:
        self._register(conn)
        # A connection handed back while still registered may have been read (and its buffered requests parsed,
        # even handed to a worker again) before it got here: parse only one that is still waiting for its head.
        if conn.buf and conn.state in (IDLE, HEAD) and not conn.closed:
            self._parse(conn)

    # --- bookkeeping
    def _register(self, conn: Conn) -> None:
        with self._selector_lock:
            if conn.registered:
                return
            try:
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
                conn.registered = True
            except (ValueError, KeyError, OSError):
                self._close(conn, "register-failed")

    def _unregister(self, conn: Conn) -> None:
        with self._selector_lock:
            if conn.registered:
                conn.registered = False
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(conn.sock)

    def _close(self, conn: Conn, reason: str) -> None:
        with self._selector_lock:
            if conn.closed:
                return
            conn.closed = True
        self._unregister(conn)  # before the close: the selector must never hold a closed descriptor
        admission, conn.admission = conn.admission, None
        if admission is not None:
            admission.release()
        with self._conns_lock:
            if self._conns.get(conn.fd) is conn:
                del self._conns[conn.fd]
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._count(reason)

    def _count(self, reason: str) -> None:
        if self._on_close is not None:
            self._on_close(reason)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._waker_w.send(b"x")
