"""The transfer bench's throughput parts (bench/transfer.py): raw broker rounds, end to end sequential and overlapped,
the byte-rate cap's accuracy, and one bundle to a fleet of in-process fetchers against the broker's raw fan-out."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgefleet.agent.transfer.blocks import BlockDownload
from edgefleet.agent.transfer.link import LinkPacer
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.publishing.offer_first_blocks import publish_offer_first
from support.publishing.offer_first_chunks import publish_chunked_early

WINDOW = 16  # the agent's default block_window (the initial window; the RTT window grows it where needed)


def raw_round(host: Connection, devices: list[Connection], data: bytes, block: int, tag: str) -> float:
    """The same bytes as block-sized QoS 1 messages from the host to every device (the broker's bandwidth)."""
    chunks = [data[i : i + block] for i in range(0, len(data), block)]
    want = len(chunks) * len(devices)
    done, lock, received = threading.Event(), threading.Lock(), [0]

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        with lock:
            received[0] += 1
            if received[0] == want:
                done.set()

    topic = f"bench/raw/{tag}"
    for device in devices:
        device.subscribe(topic, on_message)
    _settle(devices)
    start = time.perf_counter()
    infos = [host.publish(topic, chunk, qos=1) for chunk in chunks]
    for info in infos:
        info.wait_for_publish(120)
    if not done.wait(600):
        raise RuntimeError(f"raw: received {received[0]} of {want}")
    elapsed = time.perf_counter() - start
    for device in devices:
        device.unsubscribe(topic)
    return elapsed


def _settle(devices: list[Connection]) -> None:
    """A device's subscriptions are in place once a message it publishes after them comes back to it (one
    connection's packets are handled in order; across connections they are not)."""
    marker = f"bench/settle/{time.monotonic_ns()}"
    seen = threading.Semaphore(0)
    for i, device in enumerate(devices):
        device.subscribe(f"{marker}/{i}", lambda t, p, r: seen.release())
        device.publish(f"{marker}/{i}", b"x", qos=1)
    for _ in devices:
        if not seen.acquire(timeout=60):
            raise RuntimeError("subscriptions did not settle")
    for i, device in enumerate(devices):
        device.unsubscribe(f"{marker}/{i}")


class DeviceProcess:
    """bench/transfers/device.py: the device in its own process, as on another machine."""

    def __init__(self, broker_url: str, prefix: list[str] | None = None, python: str | None = None) -> None:
        """`prefix`: what runs the process elsewhere (`ip netns exec NAME`: its own network namespace). `python`:
        another interpreter, whose environment's edgefleet the device runs (a baseline checkout's agent)."""
        self.proc = subprocess.Popen(
            [*(prefix or []), python or sys.executable, str(Path(__file__).with_name("device.py")), broker_url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, command: str) -> None:
        """Send a command and wait until the device is subscribed and ready."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self._expect("ready")

    def done(self) -> float:
        """When the device finished (its time.perf_counter(): CLOCK_MONOTONIC, shared by this machine's processes)."""
        return self.done_cpu()[0]

    def done_cpu(self) -> tuple[float, float | None]:
        """(when the device finished, its CPU seconds for the fetch, where it reports them)."""
        words = self._expect("done").split()
        return float(words[0]), (float(words[1]) if len(words) > 1 else None)

    def _expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith(word):
            raise RuntimeError(f"device process answered {line!r}, expected {word!r} (exit {self.proc.poll()})")
        return line[len(word) :].strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(30)


def raw_remote(host: Connection, device: DeviceProcess, data: bytes, block: int, tag: str) -> float:
    """The same bytes as block-sized QoS 1 messages to the device process (the broker's bandwidth)."""
    chunks = [data[i : i + block] for i in range(0, len(data), block)]
    topic = f"bench/raw/{tag}"
    device.ask(f"raw {topic} {len(chunks)}")
    start = time.perf_counter()
    infos = [host.publish(topic, chunk, qos=1) for chunk in chunks]
    for info in infos:
        info.wait_for_publish(120)
    return device.done() - start


def bundle_remote(
    host: Connection,
    device: DeviceProcess,
    bundle: Path,
    block: int,
    *,
    offer_first: bool,
    chunks: bool = False,
    cpu: list[float] | None = None,
) -> tuple[float, float]:
    """The device process waits on the bundle's offer and fetches it (`BlockDownload`, or with `chunks` the agent's
    chunked download: index pages read first when the offer has them); the host publishes it offer first
    (tests/support/publishing/offer_first_blocks.py, or for chunks offer_first_chunks.py beside it: the fetch
    overlaps the publishing) or offer last (`publish_bundle`: the fetch follows it). (publish s, end to end s): from
    the host's first byte to the device's verified file; the device's CPU seconds for the fetch go to `cpu`."""
    bundle_id = parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id
    device.ask(f"fetch {bundle_id} {WINDOW}")
    start = time.perf_counter()
    if offer_first and chunks:
        publish_chunked_early(host, Topics(), bundle, block_size=block)
    elif offer_first:
        publish_offer_first(host, Topics(), bundle, block_size=block)
    else:
        publish_bundle(host, Topics(), bundle, block_size=block, layout="chunks" if chunks else "blocks")
    published = time.perf_counter()
    end, cpu_s = device.done_cpu()
    if cpu is not None and cpu_s is not None:
        cpu.append(cpu_s)
    return published - start, end - start


def cap_trial(host: Connection, device: Connection, bundle: Path, block: int, work: Path, cap: int) -> dict:
    """A device-side download under a cap; achieved bytes/s by the pacer's own counters and clock."""
    topics = Topics()
    _, offer = publish_bundle(host, topics, bundle, block_size=block, layout="blocks")
    link = LinkPacer(config_cap=cap)
    fetch = BlockDownload(device, topics, offer, work / "capped.part", window=WINDOW, link=link)
    start = time.monotonic()
    fetch.run()
    elapsed = time.monotonic() - start
    fetch.cleanup()
    achieved = link.bulk_bytes / elapsed
    return {
        "cap_bytes_per_s": cap,
        "seconds": round(elapsed, 1),
        "bytes": link.bulk_bytes,
        "achieved_bytes_per_s": round(achieved),
        "achieved_vs_cap": round(achieved / cap, 3),
        "final_window": fetch.pacing.window(),
    }


def fleet_trial(broker_url: str, bundle: Path, block: int, work: Path, devices: int, data: bytes) -> dict:
    """One bundle to `devices` fetchers in this process (each its own MQTT connection and downloader thread, every
    block hashed once, as on a device), against the broker's raw fan-out of the same bytes to the same
    connections."""
    topics = Topics()
    host = Connection(broker_url, "bench-fleet-host").start()
    conns = [Connection(broker_url, f"bench-fleet-{i}").start(wait=60) for i in range(devices)]
    try:
        raw_s = raw_round(host, conns, data, block, "fleet")
        _, offer = publish_bundle(host, topics, bundle, block_size=block, layout="blocks")
        errors: list[BaseException] = []
        downloads = [
            BlockDownload(c, topics, offer, work / f"fleet-{i}.part", window=WINDOW) for i, c in enumerate(conns)
        ]

        def run(download: BlockDownload) -> None:
            try:
                download.run()
            except BaseException as err:
                errors.append(err)
            finally:
                download.cleanup()

        threads = [threading.Thread(target=run, args=(d,)) for d in downloads]
        cpu0, start = time.process_time(), time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        fleet_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
        if errors:
            raise RuntimeError(f"{len(errors)} fleet downloads failed: {errors[0]}")
    finally:
        for conn in conns:
            conn.stop()
        host.stop()
    hash_cpu_s = _hash_cpu_seconds(data, block) * devices
    return {
        "devices": devices,
        "bundle_mb": round(len(data) / 1e6, 2),
        "raw_fanout_s": round(raw_s, 2),
        "fleet_end_to_end_s": round(fleet_s, 2),
        "ratio_fleet_vs_raw_fanout": round(raw_s / fleet_s, 3),
        "process_cpu_s": round(cpu_s, 2),
        "hashing_cpu_s": round(hash_cpu_s, 2),
        "hashing_share_of_fleet_time": round(hash_cpu_s / fleet_s, 3),
    }


def _hash_cpu_seconds(data: bytes, block: int) -> float:
    """CPU seconds of one device's hashing: every block once (best of 3; there is no whole-file pass)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for i in range(0, len(data), block):
            hashlib.sha256(data[i : i + block]).digest()
        best = min(best, time.process_time() - start)
    return best
