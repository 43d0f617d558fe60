"""The transfer bench's user-space link (bench/transfers/shaper.py): its rate and delay by arithmetic on an injected
clock, then one short relay run on loopback whose figures only have to be in the right order of magnitude."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time

import pytest

from support.paths import REPO


def _shaper():
    spec = importlib.util.spec_from_file_location("bench_shaper", REPO / "bench" / "transfers" / "shaper.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_shaper"] = module
    spec.loader.exec_module(module)
    return module


shaper = _shaper()


def test_bytes_leave_at_the_rate_one_after_another_and_arrive_a_delay_later() -> None:
    link = shaper.LinkModel(rate_bytes_per_s=1000, delay_s=0.025)
    assert link.schedule(100, now=10.0) == pytest.approx(10.0 + 0.1 + 0.025)
    # offered while the first is still on the wire: it waits for the wire, then takes its own time
    assert link.schedule(100, now=10.05) == pytest.approx(10.2 + 0.025)
    # offered once the wire is idle: only its own time and the delay
    assert link.schedule(50, now=20.0) == pytest.approx(20.05 + 0.025)
    assert link.sent_bytes == 250


def test_a_busy_link_delivers_at_exactly_its_rate_whatever_the_piece_sizes() -> None:
    link = shaper.LinkModel(rate_bytes_per_s=2.5e6, delay_s=0.0025)  # 20 Mbit/s
    sizes = [16384, 1, 700, 16384, 9000] * 200
    last = max(link.schedule(n, now=0.0) for n in sizes)
    assert sum(sizes) / (last - 0.0025) == pytest.approx(2.5e6)


def test_the_bottleneck_queue_is_bounded() -> None:
    link = shaper.LinkModel(rate_bytes_per_s=1000, delay_s=0.0)
    buffer = 300.0
    assert link.wait_for_room(100, now=0.0, buffer_bytes=buffer) == 0.0
    link.schedule(300, now=0.0)  # the queue is full
    assert link.backlog(0.0) == pytest.approx(300)
    assert link.wait_for_room(100, now=0.0, buffer_bytes=buffer) == pytest.approx(0.1)  # 100 bytes must leave
    assert link.backlog(0.2) == pytest.approx(100)
    assert link.wait_for_room(100, now=0.2, buffer_bytes=buffer) == 0.0
    # a piece bigger than the buffer waits for an empty queue, not forever
    assert link.wait_for_room(1000, now=0.2, buffer_bytes=buffer) == pytest.approx(0.1)


def test_the_buffer_is_one_bandwidth_delay_product_at_least_64_kib() -> None:
    assert shaper.buffer_for(25e6, 0.005) == pytest.approx(125_000)
    assert shaper.buffer_for(1e6, 0.005) == 64 * 1024


def test_a_link_needs_a_rate() -> None:
    with pytest.raises(ValueError):
        shaper.LinkModel(0, 0.01)


def test_the_relay_carries_bytes_both_ways_at_about_the_rate_and_after_the_delay() -> None:
    """4 Mbit/s and 100 ms RTT: 200 kB take 0.4 s on the wire; generous bounds for a loaded machine."""

    async def run() -> tuple[float, bytes]:
        async def echo_count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received = 0
            while received < 200_000:
                data = await reader.read(65536)
                if not data:
                    break
                received += len(data)
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo_count, "127.0.0.1", 0)
        up_port = upstream.sockets[0].getsockname()[1]
        listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        relay_task = asyncio.create_task(
            shaper.serve(("127.0.0.1", 0), ("127.0.0.1", up_port), 0.5e6, 0.1, listening.set_result)
        )
        port = await asyncio.wait_for(listening, 10)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        writer.write(b"x")
        await writer.drain()
        writer.write(bytes(199_999))
        await writer.drain()
        answer = await reader.read(2)
        elapsed = time.monotonic() - start
        writer.close()
        relay_task.cancel()
        upstream.close()
        return elapsed, answer

    elapsed, answer = asyncio.run(run())
    assert answer == b"ok"
    # 0.4 s on the wire + 0.1 s of round trip at least; far less than 10x that however loaded the machine is
    assert 0.45 <= elapsed < 5.0
