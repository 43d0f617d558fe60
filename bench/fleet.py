"""The control plane at fleet scale: N simulated agents against one Mosquitto, in one run.

    python bench/fleet.py [--agents 1000] [--interval 1] [--duration 30] [--procs 2]
                          [--rollout-devices 100] [--bundle-mb 10] [--json]

1. Telemetry: N simulated agents (real MQTT clients speaking the agent protocol: retained status with a last
   will, QoS 1 telemetry with per-device seq, on one select loop per process, `--procs` processes) report
   every `--interval` s to a `control serve` process (ingestion through shared subscriptions into SQLite,
   rollout engine, dashboard). Measured over `--duration` s of steady state: the control plane's CPU (psutil,
   % of one core), Mosquitto's, the simulators'. At the end every simulator waits for its last PUBACK and the
   reports the broker acknowledged are looked up in the store, by (device, seq): lost = acknowledged but
   not stored.
2. Bandwidth, in the same run and with the fleet still reporting: the broker's raw fan-out (the bundle's
   bytes as plain 128 KiB QoS 1 messages to `--rollout-devices` subscribers) against a real rollout of a
   signed bundle of the same size to the same devices (engine → desired → offer → windowed retained blocks →
   per-block sha256 → committed status), one wave, timed to the last commit and to the rollout's success.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test helper that starts Mosquitto

from edgefleet.control.publish import publish_bundle  # noqa: E402
from edgefleet.control.rollout_engine import bundle_ref, load_doc, make_spec, prepare_rollout  # noqa: E402
from edgefleet.control.simulate import SimFleet, synthetic_bundle  # noqa: E402
from edgefleet.control.store import BundleRecord, GroupDef, open_store  # noqa: E402
from edgefleet.core.mqtt import Connection  # noqa: E402
from edgefleet.core.signing import SigningKey, generate_keypair  # noqa: E402
from edgefleet.core.topics import Topics  # noqa: E402

from brokers import MosquittoBroker  # noqa: E402

BLOCK = 128 * 1024
# `control serve` through the real entry point (registers the control commands if main.py does not yet).
LAUNCH = (
    "import sys; from edgefleet.cli import control_cmd, main\n"
    "if control_cmd not in main.COMMANDS: main.COMMANDS = (*main.COMMANDS, control_cmd)\n"
    "sys.exit(main.main(sys.argv[1:]))"
)


def worker(pipe: Pipe, broker: str, device_ids: list[str], interval: float) -> None:
    """One simulator process: its devices on one loop; answers commands from the bench over a pipe."""
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    fleet = SimFleet(broker, device_ids, groups=["bench"], telemetry_interval=interval, connect_per_tick=100).start()
    pipe.send(fleet.wait_connected(120))
    while True:
        command, arg = pipe.recv()
        if command == "stats":
            pipe.send(fleet.snapshot())
        elif command == "raw":
            fleet.raw_subscribe(arg[0], arg[1])
            pipe.send(True)
        elif command == "commits":
            pipe.send(list(fleet.commits))
        elif command == "stop":
            fleet.stop()
            pipe.send({"stats": fleet.stats.as_dict(), "acked": {d.device_id: d.acked_telemetry
                                                                  for d in fleet.devices.values()}})  # fmt: skip
            return


class Sims:
    def __init__(self, broker: str, count: int, procs: int, interval: float) -> None:
        self.ids = [f"bench-{i:05d}" for i in range(count)]
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Pipe] = []
        self.procs = []
        for k in range(procs):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(theirs, broker, self.ids[k::procs], interval), daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
        if not all(pipe.recv() for pipe in self.pipes):
            raise RuntimeError("simulated agents did not all connect")

    def ask(self, command: str, arg: Any = None) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((command, arg))
        return [pipe.recv() for pipe in self.pipes]

    def total(self, key: str) -> int:
        return sum(int(s[key]) for s in self.ask("stats"))

    def cpu_seconds(self) -> float:
        return sum(_cpu(p.pid) for p in self.procs if p.pid is not None)


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@contextlib.contextmanager
def control_serve(broker: str, store: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "control", "serve", "--broker", broker, "--store", store,
         "--http", "127.0.0.1:0", "--instance", "bench", "--tick", "0.5"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    deadline = time.monotonic() + 300
    while sims.total("raw_bytes") < want:
        if time.monotonic() > deadline:
            raise RuntimeError("raw fan-out did not complete")
        time.sleep(0.05)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry period per agent (s)")
    parser.add_argument("--duration", type=float, default=30.0, help="steady-state measurement (s)")
    parser.add_argument("--procs", type=int, default=2, help="simulator processes")
    parser.add_argument("--rollout-devices", type=int, default=100)
    parser.add_argument("--bundle-mb", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(soft, min(hard, 4 * args.agents + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # Mosquitto and the simulators inherit it
    config = ["max_connections -1", "max_queued_messages 100000", "max_inflight_messages 64"]
    report: dict[str, Any] = {"agents": args.agents, "interval_s": args.interval, "sim_processes": args.procs,
                              "nofile_limit": wanted}  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="edgefleet-bench-fleet-") as tmp,
        MosquittoBroker(extra_config=config) as broker,
    ):
        work = Path(tmp)
        store_url = f"sqlite://{work}/control.sqlite"
        broker_proc = psutil.Process(broker._process.pid)  # type: ignore[union-attr]
        with control_serve(broker.url, store_url) as plane:
            store = open_store(store_url)
            started = time.monotonic()
            sims = Sims(broker.url, args.agents, args.procs, args.interval)
            report["connect_s"] = round(time.monotonic() - started, 1)
            deadline = time.monotonic() + 120
            while len(store.device_ids()) < args.agents and time.monotonic() < deadline:
                time.sleep(0.5)
            report["registered"] = len(store.device_ids())
            time.sleep(5.0)  # warm-up: every agent on its telemetry period

            # --- 1. steady-state telemetry
            cp, mq, sim = _cpu(plane.pid), _cpu(broker_proc.pid), sims.cpu_seconds()
            acked0, stored0, wall0 = sims.total("telemetry_acked"), store.telemetry_count(), time.monotonic()
            time.sleep(args.duration)
            wall = time.monotonic() - wall0
            acked1, stored1 = sims.total("telemetry_acked"), store.telemetry_count()
            report["steady"] = {
                "seconds": round(wall, 1),
                "reports_per_s_acked": round((acked1 - acked0) / wall, 1),
                "reports_per_s_stored": round((stored1 - stored0) / wall, 1),
                "control_cpu_pct": round(100 * (_cpu(plane.pid) - cp) / wall, 1),
                "broker_cpu_pct": round(100 * (_cpu(broker_proc.pid) - mq) / wall, 1),
                "simulators_cpu_pct": round(100 * (sims.cpu_seconds() - sim) / wall, 1),
                "control_rss_mb": round(psutil.Process(plane.pid).memory_info().rss / 2**20, 1),
            }

            # --- 2. bandwidth: raw fan-out, then a rollout of a signed bundle of the same size
            targets = sims.ids[: args.rollout_devices]
            size = int(args.bundle_mb * 1e6)
            key = SigningKey.load(generate_keypair(work / "keys")[0])
            v1 = synthetic_bundle(work, key, model_name="bench", version="1", size_bytes=64 * 1024)
            v2 = synthetic_bundle(work, key, model_name="bench", version="2", size_bytes=size, seed=2)
            host = Connection(broker.url, "bench-host").start()
            raw_s = raw_fanout(host, sims, targets, v2.stat().st_size)
            publish_started = time.perf_counter()
            manifests = {}
            for name, path in (("v1", v1), ("v2", v2)):
                manifest, offer = publish_bundle(host, Topics(), path)
                store.put_bundle(BundleRecord(manifest.bundle_id, manifest.model_name, manifest.model_version,
                                              manifest.profile, offer.transfer.size, 0.01, time.time()))  # fmt: skip
                manifests[name] = manifest
            publish_s = time.perf_counter() - publish_started
            host.stop()
            store.put_group(GroupDef("bench-rollout", tuple(targets)))
            cp, mq, sim, wall0 = _cpu(plane.pid), _cpu(broker_proc.pid), sims.cpu_seconds(), time.monotonic()
            spec = make_spec(
                group="bench-rollout", bundles=[bundle_ref(manifests["v2"])], canary=str(len(targets)), waves=[],
                thresholds={"max_latency_factor": 1.5, "max_golden_drop": 0.01, "max_error_rate": 0.01},
                timing={"baseline_s": 0.0, "observe_s": 2.0, "install_timeout_s": 600.0, "min_reports": 1},
            )  # fmt: skip
            rollout_started = time.time()
            rollout_id = prepare_rollout(store, spec).id
            doc = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
            while doc.active and time.time() - rollout_started < 900:
                time.sleep(0.2)
                doc = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
            rollout_s = time.time() - rollout_started
            rollout_wall = time.monotonic() - wall0
            rollout_cpu = {
                "control_cpu_pct_during_rollout": round(100 * (_cpu(plane.pid) - cp) / rollout_wall, 1),
                "broker_cpu_pct_during_rollout": round(100 * (_cpu(broker_proc.pid) - mq) / rollout_wall, 1),
                "simulators_cpu_pct_during_rollout": round(100 * (sims.cpu_seconds() - sim) / rollout_wall, 1),
            }
            commits = [t for c in sims.ask("commits") for d, b, t in c if b == manifests["v2"].bundle_id]
            last_commit_s = max(commits) - rollout_started if commits else float("nan")
            issued = [p.issued_at for p in store.published().values() if p.bundle_id == manifests["v2"].bundle_id]
            first_desired_s = min(issued) - rollout_started if issued else float("nan")
            bundle_mb = v2.stat().st_size / 1e6
            report["rollout"] = {
                "devices": len(targets),
                "bundle_mb": round(bundle_mb, 2),
                "raw_fanout_s": round(raw_s, 2),
                "raw_fanout_mb_s": round(bundle_mb * len(targets) / raw_s, 1),
                "publish_s": round(publish_s, 2),
                "rollout_first_desired_s": round(first_desired_s, 2),
                "rollout_last_commit_s": round(last_commit_s, 2),
                "transfer_s": round(last_commit_s - first_desired_s, 2),
                "ratio_transfer_vs_raw": round((last_commit_s - first_desired_s) / raw_s, 2),
                "rollout_mb_s": round(bundle_mb * len(targets) / last_commit_s, 1),
                "ratio_rollout_vs_raw": round(last_commit_s / raw_s, 2),
                "rollout_state": doc.state,
                "rollout_total_s": round(rollout_s, 2),
                "committed": len(commits),
                **rollout_cpu,
            }

            # --- accounting: every acknowledged report must be in the store
            results = sims.ask("stop")
            acked = {d: seqs for r in results for d, seqs in r["acked"].items()}
            sent = sum(r["stats"]["telemetry_sent"] for r in results)
            total_acked = sum(len(s) for s in acked.values())
            lost = _lost(store, acked)
            counters = store.counters()
            report["telemetry"] = {
                "sent": sent, "acked": total_acked, "stored": store.telemetry_count(), "lost": lost,
                "duplicates_dropped": counters.get("ingest.duplicates", 0),
                "refused": counters.get("ingest.malformed", 0) + counters.get("ingest.unknown_device", 0),
            }  # fmt: skip
            store.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def _lost(store: Any, acked: dict[str, list[int]], settle_s: float = 60.0) -> int:
    """Acknowledged reports missing from the store, once ingestion has caught up (or `settle_s` passed)."""
    deadline = time.monotonic() + settle_s
    while True:
        missing = 0
        for device, seqs in acked.items():
            stored = {p.seq for p in store.telemetry(device, 0.0)}
            missing += sum(1 for s in seqs if s not in stored)
        if missing == 0 or time.monotonic() > deadline:
            return missing
        time.sleep(1.0)


def print_table(r: dict[str, Any]) -> None:
    s, t, ro = r["steady"], r["telemetry"], r["rollout"]
    rows = [
        ("simulated agents (processes)", f"{r['agents']} ({r['sim_processes']})"),
        ("telemetry period per agent", f"{r['interval_s']:g} s"),
        ("all connected and registered", f"{r['connect_s']} s, {r['registered']} in the registry"),
        ("reports/s acknowledged by the broker", f"{s['reports_per_s_acked']}"),
        ("reports/s stored", f"{s['reports_per_s_stored']}"),
        ("control plane CPU (% of one core)", f"{s['control_cpu_pct']} %  (RSS {s['control_rss_mb']} MB)"),
        ("Mosquitto CPU", f"{s['broker_cpu_pct']} %"),
        ("simulators CPU (all processes)", f"{s['simulators_cpu_pct']} %"),
        ("telemetry sent / acknowledged / stored", f"{t['sent']} / {t['acked']} / {t['stored']}"),
        ("acknowledged but not stored (lost)", f"{t['lost']}"),
        ("duplicates dropped / refused", f"{t['duplicates_dropped']} / {t['refused']}"),
        (f"raw fan-out: {ro['bundle_mb']} MB to {ro['devices']} subscribers",
         f"{ro['raw_fanout_s']} s ({ro['raw_fanout_mb_s']} MB/s delivered)"),
        ("bundle publish (blocks + signed offer)", f"{ro['publish_s']} s"),
        ("rollout: engine publishes the desired bundle", f"{ro['rollout_first_desired_s']} s after the start"),
        (f"rollout to {ro['devices']} devices, last commit", f"{ro['rollout_last_commit_s']} s "
         f"({ro['rollout_mb_s']} MB/s delivered, {ro['ratio_rollout_vs_raw']}x raw)"),
        ("  of which desired → last commit (transfer)", f"{ro['transfer_s']} s ({ro['ratio_transfer_vs_raw']}x raw)"),
        ("rollout verdict (observe 2 s)", f"{ro['rollout_state']} after {ro['rollout_total_s']} s, "
         f"{ro['committed']} committed"),
        ("CPU during the rollout: control / broker / sims", f"{ro['control_cpu_pct_during_rollout']} % / "
         f"{ro['broker_cpu_pct_during_rollout']} % / {ro['simulators_cpu_pct_during_rollout']} %"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    print(f"{'what':{width}}  figure")
    for key, value in rows:
        print(f"{key:{width}}  {value}")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
