"""A shaped link in user space: a TCP relay with a rate and a one-way delay in each direction (tc's netem is not in
every kernel; this needs none of it).

    python bench/transfers/shaper.py --listen HOST:PORT --upstream HOST:PORT --mbit 20 --rtt-ms 50

Prints `listening PORT` once it accepts connections (PORT 0: any free port), then relays every connection to
`--upstream` until killed. Each direction of each connection is its own link (`LinkModel`): bytes leave at `--mbit`
(serialized one after another, as on a wire), then arrive half the round trip later. The bottleneck's buffer holds at
most `buffer_bytes` not yet serialized (one bandwidth-delay product, at least 64 KiB); past that the relay stops
reading, so the sender's TCP feels the link's rate as a real bottleneck's back-pressure (no bytes are dropped: this is
a link, not a loss model).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable

PIECE = 16 * 1024  # bytes read at a time: at 20 Mbit/s, 6.6 ms on the wire


class LinkModel:
    """One direction of a link: a rate (bytes/s) and a one-way delay (s), on an injected clock's times.

    `schedule(n, now)`: n bytes offered at `now` start on the wire once the bytes before them have left, take
    n / rate to leave, and arrive `delay` later; returns that arrival time. `backlog(now)`: bytes offered and not yet
    on the wire (the bottleneck's queue)."""

    def __init__(self, rate_bytes_per_s: float, delay_s: float) -> None:
        if rate_bytes_per_s <= 0 or delay_s < 0:
            raise ValueError("a link needs a positive rate and a delay of at least 0")
        self.rate, self.delay = float(rate_bytes_per_s), float(delay_s)
        self.free_at = float("-inf")  # when the wire is free of what was offered so far
        self.sent_bytes = 0

    def schedule(self, nbytes: int, now: float) -> float:
        start = max(now, self.free_at)
        self.free_at = start + nbytes / self.rate
        self.sent_bytes += nbytes
        return self.free_at + self.delay

    def backlog(self, now: float) -> float:
        return max(0.0, self.free_at - now) * self.rate

    def wait_for_room(self, nbytes: int, now: float, buffer_bytes: float) -> float:
        """Seconds until `nbytes` more fit in a buffer of `buffer_bytes` (0: now). A piece larger than the buffer
        fits once the queue is empty."""
        excess = self.backlog(now) + nbytes - max(buffer_bytes, nbytes)
        return max(0.0, excess / self.rate)


def buffer_for(rate_bytes_per_s: float, rtt_s: float) -> float:
    """The bottleneck's buffer: one bandwidth-delay product, at least 64 KiB."""
    return max(64 * 1024.0, rate_bytes_per_s * rtt_s)


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    link: LinkModel,
    buffer_bytes: float,
    clock: Callable[[], float],
) -> None:
    """Bytes from `reader` to `writer` through `link`: a reading task that waits for room in the bottleneck, a
    writing task that delivers each piece at its arrival time (in order: arrival times never decrease)."""
    line: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def deliver() -> None:
        while (item := await line.get()) is not None:
            at, data = item
            wait = at - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        while data := await reader.read(PIECE):
            room = link.wait_for_room(len(data), clock(), buffer_bytes)
            if room > 0:
                await asyncio.sleep(room)
            line.put_nowait((link.schedule(len(data), clock()), data))
    except (ConnectionError, OSError):
        pass
    finally:
        line.put_nowait(None)
        with contextlib.suppress(ConnectionError, OSError):
            await delivering
        writer.close()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _announce(port: int) -> None:
    sys.stdout.write(f"listening {port}\n")
    sys.stdout.flush()


async def serve(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    rate_bytes_per_s: float,
    rtt_s: float,
    on_listening: Callable[[int], None] = _announce,
) -> None:
    loop = asyncio.get_running_loop()
    buffer_bytes = buffer_for(rate_bytes_per_s, rtt_s)

    async def relay(down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            down_writer.close()
            return
        _no_delay(down_writer)
        _no_delay(up_writer)
        await asyncio.gather(
            _pump(down_reader, up_writer, LinkModel(rate_bytes_per_s, rtt_s / 2), buffer_bytes, loop.time),
            _pump(up_reader, down_writer, LinkModel(rate_bytes_per_s, rtt_s / 2), buffer_bytes, loop.time),
        )

    server = await asyncio.start_server(relay, *listen)
    on_listening(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--upstream", type=_address, required=True)
    parser.add_argument("--mbit", type=float, required=True, help="the rate of each direction, Mbit/s")
    parser.add_argument("--rtt-ms", type=float, required=True, help="the round trip (half of it each way), ms")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.upstream, args.mbit * 1e6 / 8, args.rtt_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
