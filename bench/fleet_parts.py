"""The fleet bench's moving parts: simulator processes that grow step by step, the control-plane instances, the
broker and the database, and CPU accounting. `bench/fleet.py` drives them."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the helpers that start Mosquitto, PostgreSQL and `control serve`

from edgefleet.core.mqtt.connection import Connection  # noqa: E402

from support.servers.brokers import MosquittoBroker  # noqa: E402
from support.servers.control_procs import ServeProcess  # noqa: E402
from support.servers.pg_server import PostgresServer  # noqa: E402
from support.simulate.agents import SimFleet  # noqa: E402
from support.simulate.spool import ResendPolicy  # noqa: E402

BLOCK = 128 * 1024


def worker(pipe: Pipe, broker: str, device_ids: list[str], interval: float, resend: ResendPolicy | None) -> None:
    """One simulator process: its devices (one real MQTT connection each) on one select loop; answers the bench.
    `resend`: the devices spool and re-send as the agent does; None: they fire and forget."""
    fleet = SimFleet(broker, device_ids, groups=["bench"], telemetry_interval=interval, connect_per_tick=100,
                     resend=resend).start()  # fmt: skip
    pipe.send(fleet.wait_connected(300))
    while True:
        command, arg = pipe.recv()
        if command == "stats":
            pipe.send(fleet.snapshot())
        elif command == "raw":
            fleet.raw_subscribe(arg[0], arg[1])
            pipe.send(True)
        elif command == "commits":
            pipe.send(list(fleet.commits))
        elif command == "quiet":
            fleet.quiet_down()
            pipe.send(True)
        elif command == "spooled":
            pipe.send(fleet.spooled())
        elif command == "stop":
            fleet.quiet_down()
            spooled = fleet.spooled_telemetry()  # what the devices still hold when they stop sending
            fleet.stop(drain_s=30.0)
            pipe.send({"stats": fleet.stats.as_dict(), "spooled": spooled,
                       "acked": {d.device_id: d.acked_telemetry for d in fleet.devices.values()}})  # fmt: skip
            return


class Sims:
    """Simulator processes, `per_proc` devices each; `grow(n)` adds processes until n devices run."""

    def __init__(self, broker: str, per_proc: int, interval: float, resend: ResendPolicy | None = None) -> None:
        self.broker, self.per_proc, self.interval, self.resend = broker, per_proc, interval, resend
        self.ids: list[str] = []
        self.pipes: list[Pipe] = []
        self.procs: list[Any] = []
        self._ctx = multiprocessing.get_context("spawn")

    def grow(self, count: int) -> None:
        started = []
        while len(self.ids) < count:
            ids = [f"bench-{i:05d}" for i in range(len(self.ids), min(count, len(self.ids) + self.per_proc))]
            mine, theirs = self._ctx.Pipe()
            proc = self._ctx.Process(target=worker, args=(theirs, self.broker, ids, self.interval, self.resend),
                                     daemon=True)  # fmt: skip
            proc.start()
            self.ids += ids
            self.pipes.append(mine)
            self.procs.append(proc)
            started.append(mine)
        if not all(pipe.recv() for pipe in started):
            raise RuntimeError("simulated agents did not all connect (file descriptors? see ulimit -n)")

    def ask(self, command: str, arg: Any = None) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((command, arg))
        return [pipe.recv() for pipe in self.pipes]

    def total(self, key: str) -> int:
        return sum(int(s[key]) for s in self.ask("stats"))

    def stats(self) -> dict[str, Any]:
        """Every simulator's counters added up (`stored_delay_ds`, a histogram, bucket by bucket)."""
        total: dict[str, Any] = {"stored_delay_ds": {}}
        for stats in self.ask("stats"):
            for key, value in stats.items():
                if isinstance(value, dict):
                    for bucket, count in value.items():
                        total[key][bucket] = total[key].get(bucket, 0) + count
                elif key != "raw_last":
                    total[key] = total.get(key, 0) + value
        return total

    def spooled(self) -> dict[str, int]:
        """What the devices' spools hold, added up (`SimFleet.spooled`)."""
        total: dict[str, int] = {}
        for counts in self.ask("spooled"):
            for key, value in counts.items():
                total[key] = total.get(key, 0) + value
        return total

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def postgres_pids(server: PostgresServer) -> list[int]:
    """The postmaster and its backends (the server's CPU is theirs together)."""
    pid_file = server.datadir / "postmaster.pid"
    try:
        main = psutil.Process(int(pid_file.read_text().split()[0]))
    except (OSError, ValueError, psutil.Error):
        return []
    return [main.pid, *(c.pid for c in main.children(recursive=True))]


@contextlib.contextmanager
def backend_store(kind: str, work: Path) -> Iterator[tuple[str, PostgresServer | None]]:
    """(store URL, the PostgreSQL server or None) for one backend."""
    if kind == "sqlite":
        yield f"sqlite://{work}/control.sqlite", None
        return
    with PostgresServer(durable=True) as server:  # fsync on: write latency as a real deployment sees it
        yield server.create_database("bench"), server


@contextlib.contextmanager
def instances(broker: str, store_url: str, count: int, work: Path) -> Iterator[list[ServeProcess]]:
    options = ("--tick", "0.5", "--share-group", "bench", "--session-expiry", "120")
    procs = [ServeProcess(broker, store_url, f"bench-{i}", work, *options) for i in range(count)]
    try:
        for proc in procs:
            proc.start(timeout=120)
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def broker(agents: int, queue: int = 100_000) -> MosquittoBroker:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(soft, min(hard, 4 * agents + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # Mosquitto and the simulators inherit it
    return MosquittoBroker(extra_config=["max_connections -1", f"max_queued_messages {queue}",
                                         "max_inflight_messages 64", "sys_interval 2"])  # fmt: skip


def raw_fanout(host: Connection, sims: Sims, devices: list[str], size: int) -> float:
    """Seconds from the first publish until every subscriber holds all `size` bytes (plain QoS 1 messages)."""
    tag = f"fanout-{time.monotonic_ns()}"
    sims.ask("raw", (tag, devices))
    time.sleep(1.0)
    before = sims.total("raw_bytes")
    payload = os.urandom(BLOCK)
    start = time.perf_counter()
    infos = [host.publish(f"bench/raw/{tag}", payload[: min(BLOCK, size - off)], qos=1)
             for off in range(0, size, BLOCK)]  # fmt: skip
    for info in infos:
        info.wait_for_publish(120)
    want = before + size * len(devices)
    deadline = time.monotonic() + 600
    while sims.total("raw_bytes") < want:
        if time.monotonic() > deadline:
            raise RuntimeError("raw fan-out did not complete")
        time.sleep(0.05)
    return time.perf_counter() - start


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_hog(count: int) -> Iterator[list[int]]:
    """`count` processes that each keep a core busy for as long as the block runs (a machine deliberately loaded)."""
    procs = [multiprocessing.Process(target=_spin, name=f"cpu-hog-{i}", daemon=True) for i in range(count)]
    for proc in procs:
        proc.start()
    try:
        yield [p.pid for p in procs if p.pid is not None]
    finally:
        for proc in procs:
            proc.kill()
            proc.join(5)


@contextlib.contextmanager
def store_stalled(store_url: str, pg: PostgresServer | None) -> Iterator[str]:
    """The store stops answering for as long as the block runs: PostgreSQL's processes are stopped (SIGSTOP, as a
    hung disk or a paused VM would stop them); SQLite's write lock is held by another connection."""
    import signal
    import sqlite3

    if pg is not None:
        pids = postgres_pids(pg)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield f"SIGSTOP of {len(pids)} PostgreSQL processes"
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return
    path = store_url.removeprefix("sqlite://")
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield "SQLite's write lock held by another connection"
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def delay_quantiles(histogram: dict[int, int], quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)) -> dict[str, Any]:
    """Quantiles (s) of a histogram of 0.1 s steps (`SimStats.stored_delay_ds`): the upper edge of the step."""
    count = sum(histogram.values())
    out: dict[str, Any] = {"count": count}
    for q in quantiles:
        out[f"p{round(q * 100)}_s"] = None
        if not count:
            continue
        seen, want = 0, q * count
        for step in sorted(histogram):
            seen += histogram[step]
            if seen >= want:
                out[f"p{round(q * 100)}_s"] = round((step + 1) / 10, 1)
                break
    out["max_s"] = round((max(histogram) + 1) / 10, 1) if histogram else None
    return out


class BrokerDrops:
    """Mosquitto's count of messages it dropped (a full queue of a subscriber: `max_queued_messages`), from
    `$SYS/broker/publish/messages/dropped` (published every `sys_interval` s)."""

    TOPIC = "$SYS/broker/publish/messages/dropped"

    def __init__(self, host: Connection) -> None:
        self.value = 0
        host.subscribe(self.TOPIC, self._on)

    def _on(self, topic: str, payload: bytes, retained: bool) -> None:
        with contextlib.suppress(ValueError):
            self.value = int(payload)


def lost(
    store: Any, acked: dict[str, list[int]], settle_s: float = 120.0, spooled: dict[str, list[int]] | None = None
) -> tuple[int, int]:
    """(acknowledged reports missing from the store, reports stored twice), once ingestion caught up. With
    `spooled` (device → the numbers its spool still holds), a report still spooled is not missing: its device still
    has it and sends it again."""
    deadline = time.monotonic() + settle_s
    while True:
        missing = dup = 0
        for device, seqs in acked.items():
            stored = [p.seq for p in store.telemetry(device, 0.0)]
            have = set(stored) | set((spooled or {}).get(device, ()))
            dup += len(stored) - len(set(stored))
            missing += sum(1 for s in seqs if s not in have)
        if missing == 0 or time.monotonic() > deadline:
            return missing, dup
        time.sleep(1.0)
