"""The device side of bench/transfer.py in its own process (a device is another machine: its own interpreter).

    python bench/transfers/device.py BROKER_URL

Reads commands on stdin, one a line, answers on stdout:
- `raw TOPIC COUNT`: subscribe, answer `ready`, receive COUNT messages, answer `done T` (T: time.perf_counter(),
  CLOCK_MONOTONIC on Linux, comparable across processes of one machine);
- `fetch BUNDLE_ID WINDOW`: wait on the bundle's offer topic, answer `ready`, then on the offer run the agent's
  download for its layout (`BlockDownload`, or the index pages then `ChunkDownload`: every piece's sha256, zstd
  where the chunk travels compressed, writes, fsync), answer `done T CPU` (CPU: this process's CPU seconds, all
  threads, user + system, from `ready` to done: the waiting costs next to nothing, the fetch all of it);
- `quit`.
"""

from __future__ import annotations

import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

from edgefleet.agent.transfer.chunk_pages import resolve_index
from edgefleet.agent.transfer.chunks import open_download
from edgefleet.core.messages import BundleOffer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics


def _settle(conn: Connection) -> None:
    """Subscriptions made before are in place once a message published after them comes back."""
    back = threading.Event()
    marker = f"bench/settle/{os.getpid()}/{time.monotonic_ns()}"
    conn.subscribe(marker, lambda t, p, r: back.set())
    conn.publish(marker, b"x", qos=1)
    if not back.wait(60):
        raise RuntimeError("subscriptions did not settle")
    conn.unsubscribe(marker)


def _raw(conn: Connection, topic: str, count: int) -> float:
    done, received = threading.Event(), [0]

    def on_message(t: str, payload: bytes, retained: bool) -> None:
        received[0] += 1
        if received[0] == count:
            done.set()

    conn.subscribe(topic, on_message)
    _settle(conn)
    _answer("ready")
    if not done.wait(300):
        raise RuntimeError(f"raw: received {received[0]} of {count}")
    end = time.perf_counter()
    conn.unsubscribe(topic)
    return end


def _fetch(conn: Connection, bundle_id: str, window: int, work: Path) -> tuple[float, float]:
    topics = Topics()
    offers: queue.Queue[bytes] = queue.Queue()
    conn.subscribe(topics.bundle_offer(bundle_id), lambda t, p, r: offers.put(p))
    _settle(conn)
    _answer("ready")
    cpu = time.process_time()
    offer = decode(BundleOffer, offers.get(timeout=300))
    conn.unsubscribe(topics.bundle_offer(bundle_id))
    offer = resolve_index(conn, topics, offer, size_limit=2**40)  # a chunk list on index pages: read them first
    download = open_download(conn, topics, offer, work / f"{bundle_id}.part", bundles_dir=None, window=window)
    download.run()
    end, cpu = time.perf_counter(), time.process_time() - cpu
    download.cleanup()
    return end, cpu


def _answer(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    conn = Connection(sys.argv[1], f"bench-device-{os.getpid()}").start()
    with tempfile.TemporaryDirectory(prefix="edgefleet-bench-device-") as tmp:
        try:
            for line in sys.stdin:
                command, *args = line.split()
                if command == "quit":
                    break
                if command == "raw":
                    _answer(f"done {_raw(conn, args[0], int(args[1]))}")
                elif command == "fetch":
                    end, cpu = _fetch(conn, args[0], int(args[1]), Path(tmp))
                    _answer(f"done {end} {cpu}")
                else:
                    _answer(f"error unknown command {command}")
        finally:
            conn.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
