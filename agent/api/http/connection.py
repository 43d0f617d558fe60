"""One client connection of the local HTTP API (agent/api/http/server.py): what the I/O thread knows of it, and
sending an answer on its non-blocking socket within a deadline."""

from __future__ import annotations

import select
import socket
import time

from edgefleet.agent.api.http.protocol import Admission, Head

IDLE, HEAD, BODY, BUSY = range(4)  # a connection's state: what the I/O thread waits for, or a worker has it


class Conn:
    __slots__ = (
        "admission", "body", "buf", "closed", "deadline", "fd", "got", "head", "last", "registered", "sock", "state"
    )  # fmt: skip

    def __init__(self, sock: socket.socket, now: float, keep_alive_s: float) -> None:
        self.sock, self.fd = sock, sock.fileno()
        self.buf = bytearray()
        self.state = IDLE
        self.deadline = now + keep_alive_s
        self.last = now
        self.head: Head | None = None
        self.body = bytearray()
        self.got = 0  # the declared length of the body being read
        self.admission: Admission | None = None
        self.registered = False  # with the selector; changed only under the server's selector lock
        self.closed = False


def send_some(sock: socket.socket, data: bytes) -> int:
    """One send on a non-blocking socket: bytes sent (0 when its buffer is full), -1 when the peer is gone."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError:
        return -1


def send_rest(sock: socket.socket, data: bytes, sent: int, deadline: float) -> bool:
    """The rest of an answer, waiting for the socket to drain until `deadline`; False when it could not."""
    view = memoryview(data)
    poller = select.poll() if hasattr(select, "poll") else None  # poll has no 1024-descriptor limit
    if poller is not None:
        poller.register(sock, select.POLLOUT)
    while sent < len(data):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            if poller is not None:
                ready = bool(poller.poll(left * 1000))
            else:
                ready = bool(select.select([], [sock], [], left)[1])
            if ready:
                sent += sock.send(view[sent:])
        except (BlockingIOError, InterruptedError):
            continue
        except (OSError, ValueError):
            return False
    return True
