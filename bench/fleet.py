"""The control plane at fleet scale: up to 5,000 simulated agents, 2 control-plane instances, SQLite and PostgreSQL.

    python bench/fleet.py [--steps 1000,2000,3000,4000,5000] [--backends sqlite,postgresql] [--instances 2]
                          [--interval 1] [--duration 20] [--per-proc 1000] [--rollout-devices 500]
                          [--bundle-mb 10] [--cpu-hog N] [--store-stall S] [--no-group-change]
                          [--devices agent|fire-and-forget] [--spool-max N] [--settle S] [--broker-queue N]
                          [--json] [--out FILE]

For each backend, one Mosquitto and `--instances` real `control serve` processes on one store (they split
ingestion through shared subscriptions; one holds the engine lease). The simulated agents (real MQTT
clients speaking the agent protocol, one connection per device, `--per-proc` devices on one select loop
per process) grow step by step; at each step:
1. steady state for `--duration` s: reports acknowledged and stored per second, the control plane's CPU
   (all instances, % of one core) and per 1,000 devices, Mosquitto's, PostgreSQL's, the simulators';
   the store's telemetry write latency p95 (the instances' own write histogram, `store.write_ms.*`);
2. a group change: every device joins a host-side group whose deployment is a new (tiny) bundle version:
   the time until the leader has resolved and published the desired state of every device (broker
   acknowledged, recorded in the store), and until every device committed the bundle.
At the last step, a `--bundle-mb` bundle to `--rollout-devices` devices: the broker's raw fan-out of the
same bytes against a real one-wave rollout (engine → desired → offer → windowed retained blocks →
per-block sha256 → committed status). At the end every simulator waits for its last PUBACK and every
report the broker acknowledged is looked up in the store by (device, seq): lost = acknowledged, not stored.

The simulated devices behave as agents do (`--devices agent`, the default): each keeps its reports in an in-memory
spool bounded as the agent's (`--spool-max`, the agent's 10,000 by default) until the control plane's retained
`StoredUpTo` covers them, re-sends what the broker took but the host did not store with the agent's delay and rate
(tests/support/simulate/spool.py, the rules of agent/telemetry/spool.py and reporter.py), and says
`reports-dropped` when its spool overflows. At the end the devices stop making reports and keep re-sending for up
to `--settle` s, until every spool is empty; then lost = acknowledged by the broker, not stored, and not still in
its device's spool (a report still spooled is not lost: its device still has it). The delay from a report's first
send to the `StoredUpTo` that covers it is measured on the device (p50, p95; 0.1 s steps; the control plane sends
a device's `StoredUpTo` at most once a second). `--devices fire-and-forget`: the earlier simulator, whose devices
send each report once.

Under load: `--cpu-hog N` keeps N processes spinning beside everything for the whole run, and `--store-stall S`
stops the store for S seconds at the last step, after its steady state (PostgreSQL: its processes get SIGSTOP,
then SIGCONT; SQLite: another connection holds the write lock): the reports acknowledged meanwhile, and how long
after the store is back until everything acknowledged is stored. The goal: 0 lost once the run settles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_parts import (
    BrokerDrops,
    Sims,
    backend_store,
    broker,
    cpu_hog,
    cpu_seconds,
    delay_quantiles,
    instances,
    lost,
    postgres_pids,
    raw_fanout,
    store_stalled,
)

from edgefleet.control.credentials.keyring import init as init_keys
from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.control.rollout.engine import bundle_ref, load_doc, make_spec, prepare_rollout
from edgefleet.control.rollout.judge.bundle_facts import record_facts
from edgefleet.control.store import BundleRecord, Deployment, GroupDef, Store, open_store, write_ms_quantile
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.simulate.agents import synthetic_bundle
from support.simulate.spool import ResendPolicy

PROFILE = "generic-x86-64"


def wait_for(predicate: Any, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def publish(host: Connection, store: Store, path: Path) -> Any:
    """Publish and record the bundle with its facts (what a rollout weighs the devices' reports against), as
    `rollout start` does."""
    manifest, offer = publish_bundle(host, Topics(), path)
    store.put_bundle(BundleRecord(manifest.bundle_id, manifest.model_name, manifest.model_version, manifest.profile,
                                  offer.transfer.size, 0.01, time.time()))  # fmt: skip
    record_facts(store, path, manifest, offer.transfer)
    return manifest


def steady(store: Store, sims: Sims, pids: dict[str, list[int]], devices: int, duration: float) -> dict[str, Any]:
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    sims0, stored0, counters0 = sims.stats(), store.telemetry_count(), store.counters()
    wall0 = time.monotonic()
    time.sleep(duration)
    wall = time.monotonic() - wall0
    sims1, stored1, counters1 = sims.stats(), store.telemetry_count(), store.counters()
    acked0, acked1 = sims0["telemetry_acked"], sims1["telemetry_acked"]
    cpu = {k: round(100 * (cpu_seconds(v) - cpu0[k]) / wall, 1) for k, v in pids.items()}
    histogram = {k: v - counters0.get(k, 0) for k, v in counters1.items()}
    p95 = write_ms_quantile(histogram, 0.95)
    return {
        "seconds": round(wall, 1),
        "reports_per_s_acked": round((acked1 - acked0) / wall, 1),
        "reports_per_s_stored": round((stored1 - stored0) / wall, 1),
        "reports_per_s_resent": round((sims1["resent"] - sims0["resent"]) / wall, 1),
        "spooled_at_end": sims.spooled().get("depth") if sims.resend else None,
        "control_cpu_pct": cpu["control"],
        "control_cpu_pct_per_1000": round(cpu["control"] / (devices / 1000), 1),
        "broker_cpu_pct": cpu["broker"],
        "postgres_cpu_pct": cpu.get("postgres"),
        "simulators_cpu_pct": cpu["sims"],
        "store_write_p95_ms": p95,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def stall(store: Store, store_url: str, pg: Any, sims: Sims, seconds: float) -> dict[str, Any]:
    """The store stops for `seconds`: what the devices had acknowledged meanwhile, and how long until it is all
    stored once the store is back."""
    acked0, stored0 = sims.total("telemetry_acked"), store.telemetry_count()
    with store_stalled(store_url, pg) as how:
        time.sleep(seconds)
        acked1 = sims.total("telemetry_acked")
    back = time.monotonic()
    caught_up = wait_for(lambda: store.telemetry_count() - stored0 >= acked1 - acked0, 150, 0.5)
    return {
        "how": how,
        "seconds": seconds,
        "acked_during": acked1 - acked0,
        "caught_up": caught_up,  # within 150 s (devices that fire and forget never catch up what the broker dropped)
        "catch_up_s": round(time.monotonic() - back, 1),
        "stored_after": store.telemetry_count() - stored0,
    }


def group_change(store: Store, host: Connection, sims: Sims, bundle: Path, devices: int) -> dict[str, Any]:
    """Every device joins group bench-all, whose deployment is a new bundle version; how long until all are
    published (and committed)."""
    manifest = publish(host, store, bundle)
    store.put_deployment(Deployment("group", "bench-all", PROFILE, manifest.bundle_id, manifest.model_name,
                                    manifest.model_version, updated_at=time.time()))  # fmt: skip
    started = time.time()
    store.put_group(GroupDef("bench-all", tuple(sims.ids[:devices])))

    def published() -> int:
        return sum(1 for p in store.published().values() if p.bundle_id == manifest.bundle_id)

    ok = wait_for(lambda: published() >= devices, 180, every=0.25)
    done_s = time.time() - started
    issued = [p.issued_at for p in store.published().values() if p.bundle_id == manifest.bundle_id]
    committed_ok = wait_for(
        lambda: sum(1 for c in sims.ask("commits") for _, b, _ in c if b == manifest.bundle_id) >= devices, 180, 1.0
    )
    commits = [t for c in sims.ask("commits") for _, b, t in c if b == manifest.bundle_id]
    return {
        "devices": devices,
        "all_published": ok,
        "published_s": round(done_s, 2),
        "publish_span_s": round(max(issued) - min(issued), 2) if issued else None,
        "all_committed": committed_ok,
        "last_commit_s": round(max(commits) - started, 2) if commits else None,
    }


def bundle_vs_raw(store: Store, host: Connection, sims: Sims, work: Path, key: SigningKey, args: Any,
                  pids: dict[str, list[int]]) -> dict[str, Any]:  # fmt: skip
    targets = sims.ids[: args.rollout_devices]
    size = int(args.bundle_mb * 1e6)
    big = synthetic_bundle(work, key, model_name="bench-big", version="2", size_bytes=size, seed=2)
    raw_s = raw_fanout(host, sims, targets, big.stat().st_size)
    manifest = publish(host, store, big)
    store.put_group(GroupDef("bench-rollout", tuple(targets), priority=10))
    for device in targets:  # a rollout plans enrolled devices only (the host's records decide)
        store.set_labels(device, enrolment_labels(PROFILE, ["bench-all", "bench-rollout"]))
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    wall0 = time.monotonic()
    spec = make_spec(
        group="bench-rollout", bundles=[bundle_ref(manifest)], canary=str(len(targets)), waves=[],
        thresholds={"max_latency_factor": 10.0, "max_golden_drop": 0.5, "max_error_rate": 0.5},
        timing={"baseline_s": 0.0, "observe_s": 2.0, "install_timeout_s": 900.0, "min_reports": 1},
        allow_unjudged=["latency", "golden"],  # a transfer benchmark: no baseline is measured
    )  # fmt: skip
    started = time.time()
    rollout_id = prepare_rollout(store, spec).id
    doc = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    while doc.active and time.time() - started < 1200:
        time.sleep(0.5)
        doc = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    wall = time.monotonic() - wall0
    commits = [t for c in sims.ask("commits") for _, b, t in c if b == manifest.bundle_id]
    last_commit_s = max(commits) - started if commits else float("nan")
    mb = big.stat().st_size / 1e6
    return {
        "devices": len(targets),
        "bundle_mb": round(mb, 2),
        "raw_fanout_s": round(raw_s, 2),
        "raw_fanout_mb_s": round(mb * len(targets) / raw_s, 1),
        "rollout_last_commit_s": round(last_commit_s, 2),
        "rollout_mb_s": round(mb * len(targets) / last_commit_s, 1),
        "ratio_rollout_vs_raw": round(last_commit_s / raw_s, 2),
        "rollout_state": doc.state,
        "committed": len(commits),
        **{f"{k}_cpu_pct": round(100 * (cpu_seconds(v) - cpu0[k]) / wall, 1) for k, v in pids.items()},
    }


def settle(store: Store, sims: Sims, seconds: float) -> dict[str, Any]:
    """The devices make no more reports; their spools keep re-sending until empty or `seconds` passed. Samples of
    what the spools hold and what is stored, every 5 s (do the re-sends converge?)."""
    sims.ask("quiet")
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    while True:
        spooled, elapsed = sims.spooled(), time.monotonic() - started
        samples.append({"s": round(elapsed, 1), "spooled": spooled.get("depth", 0), "unsent": spooled.get("unsent", 0),
                        "stored": store.telemetry_count(), "resent": sims.total("resent")})  # fmt: skip
        print(f"[settle] {json.dumps(samples[-1])}", file=sys.stderr, flush=True)
        if not spooled.get("depth") or elapsed >= seconds:
            break
        time.sleep(min(5.0, max(0.5, seconds - elapsed)))
    return {"limit_s": seconds, "seconds": samples[-1]["s"], "emptied": not samples[-1]["spooled"],
            "samples": samples}  # fmt: skip


def admission_figures(store: Store, drops: BrokerDrops) -> dict[str, Any]:
    """What the control plane's admission and the broker did with what was offered: per-device budget drops,
    refusals, repeats, store retries (the store's counters, all instances), and the broker's own drops."""
    counters = store.counters()
    names = ("received", "telemetry", "events", "duplicates", "over_budget", "oversized", "invalid", "malformed",
             "unknown_device", "rejected", "store_retries", "stored_acks")  # fmt: skip
    return {**{name: counters.get(f"ingest.{name}", 0) for name in names}, "broker_dropped": drops.value}


def run_backend(kind: str, args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"backend": kind, "instances": args.instances, "steps": []}
    with tempfile.TemporaryDirectory(prefix=f"edgefleet-bench-{kind}-") as tmp:
        work = Path(tmp)
        init_keys(work / "keys")  # root, bundle and ops keys; publish and `control serve` sign with them
        os.environ["EDGEFLEET_HOME"] = str(work)
        with (
            broker(max(args.steps), args.broker_queue) as mosquitto,
            backend_store(kind, work) as (store_url, pg),
            instances(mosquitto.url, store_url, args.instances, work) as planes,
        ):
            return _run_steps(kind, args, report, work, mosquitto, store_url, pg, planes)


def _run_steps(
    kind: str, args: Any, report: dict[str, Any], work: Path, mosquitto: Any, store_url: str, pg: Any, planes: Any
) -> dict[str, Any]:
    store = open_store(store_url)
    key = SigningKey.load(work / "keys" / "bundle.key")
    host = Connection(mosquitto.url, f"bench-host-{kind}").start()
    drops = BrokerDrops(host)
    sims = Sims(mosquitto.url, args.per_proc, args.interval, args.resend)
    try:
        for index, devices in enumerate(args.steps):
            started = time.monotonic()
            sims.grow(devices)
            wait_for(lambda n=devices: len(store.device_ids()) >= n, 300, 0.5)  # type: ignore[misc]
            step: dict[str, Any] = {"devices": devices, "connect_s": round(time.monotonic() - started, 1),
                                    "registered": len(store.device_ids())}  # fmt: skip
            time.sleep(5.0)  # warm-up: every new agent on its telemetry period
            pids = {"control": [p.pid for p in planes], "broker": [mosquitto._process.pid],  # type: ignore[union-attr]
                    "sims": sims.pids(), **({"postgres": postgres_pids(pg)} if pg else {})}  # fmt: skip
            step["steady"] = steady(store, sims, pids, devices, args.duration)
            if args.store_stall and index == len(args.steps) - 1:
                step["stall"] = stall(store, store_url, pg, sims, args.store_stall)
                print(f"[{kind}] stall {json.dumps(step['stall'])}", file=sys.stderr, flush=True)
            tiny = synthetic_bundle(work, key, model_name="bench-desired", version=str(index + 1),
                                    size_bytes=4096, seed=index)  # fmt: skip
            if args.group_change:
                step["group_change"] = group_change(store, host, sims, tiny, devices)
            report["steps"].append(step)
            print(f"[{kind}] {json.dumps(step)}", file=sys.stderr, flush=True)
        if args.rollout_devices:
            report["bundle"] = bundle_vs_raw(store, host, sims, work, key, args, pids)
            print(f"[{kind}] bundle {json.dumps(report['bundle'])}", file=sys.stderr, flush=True)
        if args.resend:
            report["settle"] = settle(store, sims, args.settle)
        results = sims.ask("stop")
        acked = {d: seqs for r in results for d, seqs in r["acked"].items()}
        spooled = {d: seqs for r in results for d, seqs in r["spooled"].items()}
        missing, duplicated = lost(store, acked, settle_s=30.0 if args.resend else 120.0,
                                   spooled=spooled if args.resend else None)  # fmt: skip
        counters = store.counters()
        totals = sims_totals(results)
        report["telemetry"] = {
            "devices": "agent" if args.resend else "fire-and-forget",
            "sent": totals["telemetry_sent"],
            "acked": sum(len(s) for s in acked.values()),
            "stored": store.telemetry_count(),
            "lost": missing,
            "still_spooled": sum(len(s) for s in spooled.values()),
            "resent": totals["resent"],
            "spool_dropped": totals["spool_dropped"],
            "reports_dropped_events": totals["drops_announced"],
            "stored_twice": duplicated,
            "duplicates_dropped": counters.get("ingest.duplicates", 0),
            "store_errors": counters.get("ingest.store_errors", 0),
            "delay_to_stored": delay_quantiles(totals["stored_delay_ds"]),
        }
        report["admission"] = admission_figures(store, drops)
    finally:
        host.stop()
        store.close()
    return report


def sims_totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"stored_delay_ds": {}}
    for result in results:
        for key, value in result["stats"].items():
            if isinstance(value, dict):
                for bucket, count in value.items():
                    total[key][bucket] = total[key].get(bucket, 0) + count
            elif key != "raw_last":
                total[key] = total.get(key, 0) + value
    return total


def print_table(reports: list[dict[str, Any]]) -> None:
    header = ("backend", "devices", "acked/s", "stored/s", "CP CPU %", "CP %/1k dev", "write p95 ms", "broker %",
              "pg %", "sims %", "load", "desired all s", "committed all s")  # fmt: skip
    rows = []
    for r in reports:
        for step in r["steps"]:
            s, g = step["steady"], step.get("group_change") or {"published_s": "-", "last_commit_s": "-"}
            rows.append((r["backend"], step["devices"], s["reports_per_s_acked"], s["reports_per_s_stored"],
                         s["control_cpu_pct"], s["control_cpu_pct_per_1000"], s["store_write_p95_ms"],
                         s["broker_cpu_pct"], s["postgres_cpu_pct"] if s["postgres_cpu_pct"] is not None else "-",
                         s["simulators_cpu_pct"], s["load_avg_1m"], g["published_s"], g["last_commit_s"]))  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=True)))
    print()
    for r in reports:
        t = r["telemetry"]
        print(f"{r['backend']}: telemetry sent {t['sent']} / acknowledged {t['acked']} / stored {t['stored']}; "
              f"lost {t['lost']}, stored twice {t['stored_twice']}, duplicates dropped {t['duplicates_dropped']}, "
              f"store errors {t['store_errors']} ({t['devices']} devices)")  # fmt: skip
        if "settle" in r:
            d, st = t["delay_to_stored"], r["settle"]
            print(f"{r['backend']}: re-sent {t['resent']}, still spooled after a {st['seconds']:g} s settle "
                  f"(limit {st['limit_s']:g} s) {t['still_spooled']}, dropped by full spools {t['spool_dropped']}; "
                  f"first send to stored p50 {d['p50_s']} s, p95 {d['p95_s']} s, max {d['max_s']} s "
                  f"({d['count']} reports)")  # fmt: skip
        a = r["admission"]
        print(f"{r['backend']}: admission: {a['over_budget']} over budget, {a['oversized']} oversized, "
              f"{a['invalid']} invalid, {a['duplicates']} repeats stored once, {a['store_retries']} store retries; "
              f"the broker dropped {a['broker_dropped']}")  # fmt: skip
        for step in r["steps"]:
            s = step.get("stall")
            if s:
                outcome = (f"all stored {s['catch_up_s']} s after it was back" if s["caught_up"]
                           else f"NOT all stored within 300 s ({s['stored_after']} stored)")  # fmt: skip
                print(f"{r['backend']}: store stalled {s['seconds']:g} s at {step['devices']} devices ({s['how']}): "
                      f"{s['acked_during']} reports acknowledged meanwhile, {outcome}")  # fmt: skip
        b = r.get("bundle")
        if b:
            print(f"{r['backend']}: {b['bundle_mb']} MB to {b['devices']} devices: raw fan-out {b['raw_fanout_s']} s "
                  f"({b['raw_fanout_mb_s']} MB/s), rollout to the last commit {b['rollout_last_commit_s']} s "
                  f"({b['rollout_mb_s']} MB/s, {b['ratio_rollout_vs_raw']}x raw), {b['committed']} committed, "
                  f"{b['rollout_state']}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="1000,2000,3000,4000,5000", help="device counts, growing")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--instances", type=int, default=2, help="control serve processes on the store")
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry period per agent (s)")
    parser.add_argument("--duration", type=float, default=20.0, help="steady-state measurement per step (s)")
    parser.add_argument("--per-proc", type=int, default=1000, help="simulated devices per simulator process")
    parser.add_argument("--rollout-devices", type=int, default=500, help="0: skip the bundle transfer")
    parser.add_argument("--bundle-mb", type=float, default=10.0)
    parser.add_argument("--cpu-hog", type=int, default=0, help="processes spinning beside the run (a loaded machine)")
    parser.add_argument("--store-stall", type=float, default=0.0, help="stop the store this long at the last step (s)")
    parser.add_argument("--no-group-change", dest="group_change", action="store_false",
                        help="skip the group change at each step")  # fmt: skip
    parser.add_argument(
        "--devices",
        choices=("agent", "fire-and-forget"),
        default="agent",
        help="agent: spool until stored and re-send, as the agent does; fire-and-forget: send once",
    )
    parser.add_argument("--spool-max", type=int, default=None, help="reports a device spools (the agent's default)")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="at the end: how long the devices may re-send, making no new reports (s)")  # fmt: skip
    parser.add_argument("--broker-queue", type=int, default=100_000,
                        help="Mosquitto's max_queued_messages: what it queues per client (an instance) beyond that it "
                        "drops, after acknowledging the device")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    args.steps = sorted(int(s) for s in args.steps.split(","))
    args.resend = None
    if args.devices == "agent":
        args.resend = ResendPolicy.agent_defaults()
        if args.spool_max:
            args.resend = dataclasses.replace(args.resend, max_records=args.spool_max)
    with cpu_hog(args.cpu_hog):
        reports = [run_backend(kind.strip(), args) for kind in args.backends.split(",")]
    document = {"cpus": psutil.cpu_count(), "interval_s": args.interval, "per_proc": args.per_proc,
                "cpu_hog": args.cpu_hog, "store_stall_s": args.store_stall, "devices": args.devices,
                "broker_queue": args.broker_queue,
                "resend": dataclasses.asdict(args.resend) if args.resend else None, "settle_s": args.settle,
                "results": reports}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_table(reports)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the instances, the broker, the database
    raise SystemExit(main())
