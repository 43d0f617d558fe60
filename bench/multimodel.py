"""Three models in one real agent, one slot each, with and without the scheduler's classes (issue 33's benchmark).

    python bench/multimodel.py [--seconds 8] [--rounds 3] [--rate 5] [--burst 8] [--work DIR] [--json FILE]

One agent process (`edgefleet agent`, profile generic-x86-64, its default threads: the bundle's or measured, as on
the profile's cores), a Mosquitto broker, the three bundles deployed to three slots by signed desired documents
(bench/multimodel_bundles.py converts them once into `--work`), the agent started with `--probe-rate 0` so that only
this traffic runs, every request over its local HTTP API:
  - detector: nudenet-320n (YOLOv8n at 320×320, from the corpus) over OIP (tritonclient.http, binary tensors) at a
    fixed `--rate`, its latency measured from each request's due time (a late request counts its lateness);
  - lm: models/tinylm over the OpenAI API (`openai` client), one stream after another, 64 tokens each (ignore_eos),
    tokens/s = the streams' completion tokens (usage) over the time they took;
  - burst: magika (a file-type model from the corpus) over OIP, `--burst` requests at once every 0.5 s.
Modes, `--seconds` each, rounds rotating the order: each model alone (the others loaded, idle; the scheduled
classes); naive (all three slots "interactive": their desired documents re-published with that class, the agent
re-assigns a served slot's class without reloading it); scheduled (detector "real-time", lm "interactive", burst
"batch"). Reported as medians over the rounds: the detector's p50/p95, the lm's tokens/s, the bursts' p50 time to
the last answer, and the agent's own queue and compute time per slot (`Telemetry.scheduling`, 1 s windows pooled per
mode). Goals (issue 33): detector p95 scheduled ≤ 1.25× alone; lm ≥ 70 % of its tokens/s alone. Then admission: the
agent's `--memory-budget-mb` is the three models' needs plus half of a fourth's (the digits CNN); deploying that
fourth slot must be refused before download (no download event, 0 bundle bytes received). Between the two, the
agent's CPU with the three slots loaded and no request (`--idle-seconds`; issue 33's goal: ≤ 1 % of a core).

The clients run on the same cores as the agent (the machine's load average is in the output).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # test helpers: the broker, an agent process, a fleet watcher, the corpus

from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest  # noqa: E402
from edgefleet.core.bundle.manifest import Manifest  # noqa: E402
from edgefleet.core.messages import SlotClass, Telemetry  # noqa: E402
from edgefleet.core.mqtt.connection import Connection  # noqa: E402
from edgefleet.core.topics import Topics  # noqa: E402

from support.fleet import AgentProcess, FleetWatcher  # noqa: E402
from support.servers.brokers import MosquittoBroker, free_port  # noqa: E402

DEVICE = "mm-1"
SLOTS = ("detector", "lm", "burst")
IDLE_GOAL_PCT = 1.0  # of one core, three idle slots (issue 33 item 9)
SCHEDULED: dict[str, SlotClass] = {"detector": "real-time", "lm": "interactive", "burst": "batch"}
NAIVE: dict[str, SlotClass] = dict.fromkeys(SLOTS, "interactive")
PROFILE = "generic-x86-64"  # the bundles' (bench/multimodel_bundles.py)
P95_GOAL, TOKENS_GOAL = 1.25, 0.70


@dataclass(frozen=True)
class Mode:
    name: str
    runs: tuple[str, ...]  # the slots sent traffic
    classes: dict[str, SlotClass]


MODES = (
    Mode("detector alone", ("detector",), SCHEDULED),
    Mode("lm alone", ("lm",), SCHEDULED),
    Mode("burst alone", ("burst",), SCHEDULED),
    Mode("naive (all interactive)", SLOTS, NAIVE),
    Mode("scheduled", SLOTS, SCHEDULED),
)


def rotated(items: tuple[Mode, ...], round_index: int) -> list[Mode]:
    """The modes of round `round_index`: the order shifted by one each round, so none always runs first."""
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]


def pool(windows: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Latency summaries of several telemetry windows (count, p50_ms, p95_ms) as one: the total count, the
    count-weighted mean of the windows' p50 and p95, and the largest p95. None when no window had samples."""
    rows = [w for w in windows if w and w.get("count") and w.get("p50_ms") is not None]
    total = sum(int(w["count"]) for w in rows)
    if not total:
        return None
    return {
        "count": total,
        "p50_ms": sum(w["count"] * w["p50_ms"] for w in rows) / total,
        "p95_ms": sum(w["count"] * w["p95_ms"] for w in rows) / total,
        "p95_max_ms": max(w["p95_ms"] for w in rows),
    }


def median_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over rounds of the numbers (nested dicts key by key); other values from the first."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r.get(key) for r in rows]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = float(np.median(values))
        elif all(isinstance(v, dict) for v in values):
            out[key] = median_of(values)  # type: ignore[arg-type]
        else:
            out[key] = values[0]
    return out


# --- the clients (each on its own threads, stopped by one event)
class Detector:
    """OIP requests (tritonclient.http, binary tensors) at a fixed rate; latency from each request's due time. Each
    thread has its own client: tritonclient's connections belong to the thread that made them."""

    def __init__(self, url: str, model: str, feeds: dict[str, np.ndarray]) -> None:
        self.url, self.model, self.feeds = url, model, feeds
        self.local = threading.local()

    def call(self) -> None:
        import tritonclient.http as triton

        if not hasattr(self.local, "client"):
            self.local.client = triton.InferenceServerClient(self.url, network_timeout=60.0)
            self.local.inputs = []
            for name, value in self.feeds.items():
                item = triton.InferInput(name, list(value.shape), triton.np_to_triton_dtype(value.dtype))
                item.set_data_from_numpy(value, binary_data=True)
                self.local.inputs.append(item)
        self.local.client.infer(self.model, self.local.inputs)

    def run(self, stop: threading.Event, rate: float, out: dict[str, Any]) -> None:
        latencies, errors, start, index = [], [], time.perf_counter(), 0
        while not stop.is_set():
            due = start + index / rate
            if stop.wait(max(0.0, due - time.perf_counter())):
                break
            try:
                self.call()
                latencies.append((time.perf_counter() - due) * 1000)
            except Exception as err:  # counted, reported
                errors.append(f"{type(err).__name__}: {err}")
            index += 1
        p50, p95 = (float(v) for v in np.percentile(latencies, [50, 95])) if latencies else (None, None)
        out["detector"] = {"requests": len(latencies), "errors": len(errors),
                           "first_error": errors[0] if errors else None, "p50_ms": p50, "p95_ms": p95}  # fmt: skip


class Language:
    """OpenAI completions streamed one after another, `tokens` each."""

    def __init__(self, url: str, model: str, tokens: int) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0, timeout=60.0)
        self.model, self.tokens = model, tokens

    def stream(self) -> int:
        """One generation; its completion tokens."""
        stream = self.client.completions.create(
            model=self.model, prompt="Once upon a time", max_tokens=self.tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        used = 0
        for chunk in stream:
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        return used

    def run(self, stop: threading.Event, out: dict[str, Any]) -> None:
        tokens, streams, errors, start = 0, 0, [], time.perf_counter()
        end = start
        while not stop.is_set():
            try:
                tokens += self.stream()
                streams += 1
            except Exception as err:  # counted, reported
                errors.append(f"{type(err).__name__}: {err}")
                stop.wait(0.2)
            end = time.perf_counter()
        out["lm"] = {"streams": streams, "errors": len(errors), "first_error": errors[0] if errors else None,
                     "tokens": tokens, "tokens_per_s": tokens / (end - start) if end > start else 0.0}  # fmt: skip


class Burst:
    """`size` OIP requests at once every 0.5 s (a pool of `size` threads); the time to a burst's last answer."""

    def __init__(self, url: str, model: str, feeds: dict[str, np.ndarray], size: int) -> None:
        self.oip, self.size = Detector(url, model, feeds), size
        self.pool = ThreadPoolExecutor(size, thread_name_prefix="burst")

    def call(self) -> None:
        self.oip.call()

    def run(self, stop: threading.Event, out: dict[str, Any]) -> None:
        times, errors = [], []
        while not stop.wait(0.5):
            begin = time.perf_counter()
            for future in [self.pool.submit(self.oip.call) for _ in range(self.size)]:
                try:
                    future.result()
                except Exception as err:  # counted, reported
                    errors.append(f"{type(err).__name__}: {err}")
            times.append((time.perf_counter() - begin) * 1000)
        out["burst"] = {"bursts": len(times), "errors": len(errors), "first_error": errors[0] if errors else None,
                        "p50_ms": float(np.median(times)) if times else None}  # fmt: skip


# --- the agent's side
class Bench:
    def __init__(self, host: Connection, watcher: FleetWatcher, manifests: dict[str, Manifest]) -> None:
        self.host, self.watcher, self.manifests = host, watcher, manifests
        self.classes: dict[str, SlotClass] = {}

    def set_classes(self, classes: dict[str, SlotClass]) -> None:
        """Re-publish each slot's desired document whose class differs, then wait until the status shows them."""
        from support.publishing.desired import deploy_slot
        from support.slots import slot_of

        for slot, wanted in classes.items():
            if self.classes.get(slot) != wanted:
                deploy_slot(self.host, Topics(), self.manifests[slot], slot=slot, devices=(DEVICE,), slot_class=wanted)
        self.watcher.wait_for(
            f"slot classes {classes}",
            lambda: all(slot_of(self.watcher.status.get(DEVICE), s).slot_class == c for s, c in classes.items()),
            timeout=60,
        )
        self.classes = dict(classes)

    def scheduling(self, start: float, end: float) -> dict[str, Any]:
        """Per slot, the agent's telemetry windows that lie inside [start, end], pooled."""
        with self.watcher._lock:
            reports: list[Telemetry] = [t for t in self.watcher.telemetry if t.device_id == DEVICE]
        out: dict[str, Any] = {}
        for slot in SLOTS:
            inside = [t for t in reports if t.slot == slot and t.ts - t.window_s >= start - 0.1 and t.ts <= end + 0.3]
            timing = [t.scheduling for t in inside if t.scheduling is not None]
            out[slot] = {
                "windows": len(inside),
                "queue_ms": pool(s.queue_ms.model_dump() if s.queue_ms else None for s in timing),
                "compute_ms": pool(s.compute_ms.model_dump() if s.compute_ms else None for s in timing),
                "steps": sum(s.batches for s in timing),
                "yields": sum(s.yields for s in timing),
            }
        return out


def run_mode(mode: Mode, bench: Bench, clients: dict[str, Any], seconds: float, rate: float) -> dict[str, Any]:
    bench.set_classes(mode.classes)
    time.sleep(1.5)  # the telemetry window that saw the class change closes
    stop, out = threading.Event(), {}
    runs: dict[str, Callable[[], None]] = {
        "detector": lambda: clients["detector"].run(stop, rate, out),
        "lm": lambda: clients["lm"].run(stop, out),
        "burst": lambda: clients["burst"].run(stop, out),
    }
    threads = [threading.Thread(target=runs[slot], name=slot) for slot in mode.runs]
    start = time.time()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    end = time.time()
    for thread in threads:
        thread.join(120)
    time.sleep(1.5)  # the window that holds the mode's end is reported
    out["agent"] = bench.scheduling(start, end)
    out["load_average_1min"] = os.getloadavg()[0]
    return out


def idle_window(agent: AgentProcess, watcher: FleetWatcher, seconds: float) -> dict[str, Any]:
    """The agent's CPU with its three slots loaded and no request at all (probes off, as in the modes), as % of one
    core from /proc over `seconds` after a settle, and its own telemetry's idle figure per slot (issue 33 item 9:
    goal ≤ 1 % of a core)."""
    from idle import idle_cpu  # bench/idle.py, beside this script

    assert agent.proc is not None
    time.sleep(5.0)  # the last requests' threads go quiet
    start = time.time()
    measured = idle_cpu(agent.proc.pid, seconds)
    reported = {
        t.slot: t.idle_cpu_percent
        for t in list(watcher.telemetry)
        if t.device_id == DEVICE and t.ts >= start and t.idle_cpu_percent is not None
    }
    pct = float(measured["pct_of_core"])  # type: ignore[arg-type]
    return {"seconds": measured["seconds"], "pct_of_core": pct, "goal_pct": IDLE_GOAL_PCT, "met": pct <= IDLE_GOAL_PCT,
            "busiest_threads": measured["by_thread_name"][:4],  # type: ignore[index]
            "telemetry_idle_cpu_percent_by_slot": reported}  # fmt: skip


def admission(bench: Bench, extra: Path, needs: dict[str, float], budget_mb: float) -> dict[str, Any]:
    """Deploy the fourth slot over the budget; its refusal, its download events and the bundle bytes received."""
    from support.fleet import deploy_to

    watcher = bench.watcher

    def bulk_after(after: float) -> int | None:  # called by wait_for, which holds the watcher's lock
        reports = [t for t in watcher.telemetry if t.device_id == DEVICE and t.ts > after and t.link is not None]
        return reports[0].link.bulk_bytes if reports and reports[0].link is not None else None

    now = time.time()
    before = watcher.wait_for("a report before the fourth slot", lambda: bulk_after(now))
    bundle_id = deploy_to(bench.host, Topics(), extra, devices=(DEVICE,), slot="fourth")
    refused = watcher.event(DEVICE, "refused", bundle_id=bundle_id, timeout=60)
    after = watcher.wait_for("a report after the refusal", lambda: bulk_after(refused.ts + 0.5))
    kinds = [e.kind for e in watcher.events if e.device_id == DEVICE and e.bundle_id == bundle_id]
    downloads = [k for k in kinds if k in ("download-started", "download-progress", "downloaded")]
    return {
        "budget_mb": round(budget_mb, 1),
        "needs_mb": {k: round(v, 1) for k, v in needs.items()},
        "refused": True,
        "reason": refused.detail,
        "download_events": len(downloads),
        "bundle_bytes_fetched": int(after - before),
        "met": not downloads and after == before,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="each mode's time in a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=5.0, help="detector requests a second")
    parser.add_argument("--burst", type=int, default=8, help="requests in one burst (every 0.5 s)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens of each language-model stream")
    parser.add_argument("--threads", type=int, default=0, help="the agent's --threads (0: the bundle's or measured)")
    parser.add_argument("--work", type=Path, default=None, help="keep keys and bundles here, reused next run")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="the idle window with the three slots loaded and no request (issue 33 item 9; 0: skip)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    for logger in ("httpx", "httpx2"):  # the openai client's transport logs every request at INFO
        logging.getLogger(logger).setLevel(logging.WARNING)
    from multimodel_bundles import bundles, keys  # bench/ is the script's folder, first on the path

    from edgefleet.agent.install.admission import need_of
    from edgefleet.control.credentials import keyring

    from support.fleet import deploy_to
    from support.models import corpus

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgefleet-multimodel-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        os.environ["EDGEFLEET_HOME"] = str(work)  # the desired documents are signed with work/keys
        key_dir = keys(work)
        paths = bundles(work)
        manifests = {r: parse_manifest(read_signed_manifest(p).manifest_json) for r, p in paths.items()}
        needs = {r: need_of(m).mb for r, m in manifests.items()}
        budget_mb = sum(needs[s] for s in SLOTS) + needs["extra"] / 2
        state = work / DEVICE
        if state.exists():
            import shutil

            shutil.rmtree(state)
        broker = MosquittoBroker()
        broker.start()
        host = Connection(broker.url, "multimodel-bench-host", protocol="auto").start()
        watcher = FleetWatcher(host, Topics())
        port = free_port()
        agent = AgentProcess(
            DEVICE, state, broker=broker.url, trust=keyring.HostKeys(key_dir).root_public(), profile=PROFILE,
            telemetry_interval=1.0,
            extra=("--http-port", str(port), "--probe-rate", "0", "--memory-budget-mb", f"{budget_mb:.1f}"),
        )  # fmt: skip
        agent.cmd[agent.cmd.index("--threads") + 1] = str(args.threads)
        agent.start()
        try:
            ids = {
                s: deploy_to(host, Topics(), paths[s], devices=(DEVICE,), slot=s, slot_class=SCHEDULED[s])
                for s in SLOTS
            }
            for slot in SLOTS:
                watcher.serving(DEVICE, ids[slot], slot=slot, timeout=300)
            print("== three slots serving", file=sys.stderr, flush=True)
            bench = Bench(host, watcher, {s: manifests[s] for s in SLOTS})
            bench.classes = dict(SCHEDULED)
            url = f"127.0.0.1:{port}"
            rng = np.random.default_rng(0)
            detector_feeds = {k: v[0] for k, v in corpus.by_name("nudenet-320n").data(rng, 1).items()}
            burst_feeds = {k: v[0] for k, v in corpus.by_name(manifests["burst"].model_name).data(rng, 1).items()}
            clients = {
                "detector": Detector(url, manifests["detector"].model_name, detector_feeds),
                "lm": Language(url, manifests["lm"].model_name, args.tokens),
                "burst": Burst(url, manifests["burst"].model_name, burst_feeds, args.burst),
            }
            for _ in range(3):  # warm: each model answers once
                clients["detector"].call()
                clients["lm"].stream()
                clients["burst"].call()
            rounds: dict[str, list[dict[str, Any]]] = {m.name: [] for m in MODES}
            for index in range(args.rounds):
                for mode in rotated(MODES, index):
                    print(f"== round {index + 1}: {mode.name}", file=sys.stderr, flush=True)
                    rounds[mode.name].append(run_mode(mode, bench, clients, args.seconds, args.rate))
            idle = idle_window(agent, watcher, args.idle_seconds) if args.idle_seconds > 0 else None
            admitted = admission(bench, paths["extra"], needs, budget_mb)
            status = watcher.status.get(DEVICE)
            placements = (
                {s.slot: s.placement.model_dump() if s.placement else None for s in status.slots} if status else {}
            )
            clients["burst"].pool.shutdown()
        finally:
            agent.stop()
            host.stop()
            broker.stop()
    report = summarize(args, manifests, rounds, admitted, placements, load_start)
    report["idle"] = idle
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def compact(mode: str, index: int, row: dict[str, Any]) -> dict[str, Any]:
    """One mode's client figures in one round, flat (a row of the report's table)."""
    det, lm, burst = row.get("detector") or {}, row.get("lm") or {}, row.get("burst") or {}
    return {
        "mode": mode, "round": index + 1, "detector_p50_ms": det.get("p50_ms"), "detector_p95_ms": det.get("p95_ms"),
        "detector_errors": det.get("errors"), "lm_tokens_per_s": lm.get("tokens_per_s"), "lm_errors": lm.get("errors"),
        "burst_p50_ms": burst.get("p50_ms"), "burst_errors": burst.get("errors"),
        "load_average_1min": row["load_average_1min"],
    }  # fmt: skip


def summarize(
    args: argparse.Namespace, manifests: dict[str, Manifest], rounds: dict[str, list[dict[str, Any]]],
    admitted: dict[str, Any], placements: dict[str, Any], load_start: tuple[float, float, float],
) -> dict[str, Any]:  # fmt: skip
    medians = {name: median_of(rows) for name, rows in rounds.items()}
    alone_p95 = medians["detector alone"]["detector"]["p95_ms"]
    alone_tps = medians["lm alone"]["lm"]["tokens_per_s"]
    scheduled, naive = medians["scheduled"], medians["naive (all interactive)"]
    p95_ratio = scheduled["detector"]["p95_ms"] / alone_p95
    share = scheduled["lm"]["tokens_per_s"] / alone_tps
    return {
        "agent": {"profile": PROFILE, "threads_arg": args.threads, "placements": placements,
                  "slots": {s: f"{manifests[s].model_name} ({manifests[s].recipe.name})" for s in SLOTS}},
        "rate_per_s": args.rate, "burst_size": args.burst, "tokens_per_stream": args.tokens, "rounds": args.rounds,
        "seconds_per_mode": args.seconds, "cpus": os.cpu_count(),
        "modes": medians,
        "per_round": [compact(name, index, row) for name, rows in rounds.items() for index, row in enumerate(rows)],
        "goals": {
            "detector_p95_scheduled_over_alone": p95_ratio,
            "detector_p95_naive_over_alone": naive["detector"]["p95_ms"] / alone_p95,
            "detector_p95_goal": P95_GOAL,
            "detector_p95_met": p95_ratio <= P95_GOAL,
            "lm_tokens_scheduled_share": share,
            "lm_tokens_naive_share": naive["lm"]["tokens_per_s"] / alone_tps,
            "lm_tokens_goal": TOKENS_GOAL,
            "lm_tokens_met": share >= TOKENS_GOAL,
            "met": p95_ratio <= P95_GOAL and share >= TOKENS_GOAL,
        },
        "admission": admitted,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg()),
                         "median_1min_during_modes": float(np.median(
                             [r["load_average_1min"] for rows in rounds.values() for r in rows]))},
    }  # fmt: skip


def figure(row: dict[str, Any] | None, key: str, width: int, digits: int) -> str:
    """`row[key]` right-aligned in `width` with `digits` decimals; "-" where there is none."""
    value = row.get(key) if row else None
    return f"{value:>{width}.{digits}f}" if isinstance(value, int | float) else f"{'-':>{width}}"


def table(r: dict[str, Any]) -> str:
    slots = r["agent"]["slots"]
    lines = [
        f"one agent ({r['agent']['profile']}, {r['cpus']} cores): detector {slots['detector']} at "
        f"{r['rate_per_s']:g}/s; lm {slots['lm']} streaming {r['tokens_per_stream']} tokens; burst "
        f"{slots['burst']} x{r['burst_size']} every 0.5 s; {r['rounds']} rounds of "
        f"{r['seconds_per_mode']:g} s, medians",
        "",
        f"{'mode':<24} {'det p50':>8} {'det p95':>8} {'lm tok/s':>9} {'burst p50':>10}   agent queue p95 / compute "
        "p50 (ms) per slot",
    ]
    for name, row in r["modes"].items():
        det, lm, burst = row.get("detector"), row.get("lm"), row.get("burst")
        agent = "; ".join(
            f"{slot} {a['queue_ms']['p95_ms']:.1f}/{a['compute_ms']['p50_ms']:.1f}"
            for slot, a in row["agent"].items()
            if a.get("queue_ms") and a.get("compute_ms")
        )
        lines.append(
            f"{name:<24} {figure(det, 'p50_ms', 8, 1)} {figure(det, 'p95_ms', 8, 1)} "
            f"{figure(lm, 'tokens_per_s', 9, 0)} {figure(burst, 'p50_ms', 10, 0)}   {agent}"
        )
    g, a, load = r["goals"], r["admission"], r["load_average"]
    errors = sum(row.get(k) or 0 for row in r["per_round"] for k in ("detector_errors", "lm_errors", "burst_errors"))
    lines += [
        "",
        f"client errors (failed requests, left out of the figures): {errors}",
        f"detector p95: scheduled {g['detector_p95_scheduled_over_alone']:.2f}x alone (goal <= {P95_GOAL}x): "
        f"{'met' if g['detector_p95_met'] else 'NOT met'}; naive {g['detector_p95_naive_over_alone']:.2f}x",
        f"lm tokens/s: scheduled {g['lm_tokens_scheduled_share']:.0%} of alone (goal >= {TOKENS_GOAL:.0%}): "
        f"{'met' if g['lm_tokens_met'] else 'NOT met'}; naive {g['lm_tokens_naive_share']:.0%}",
        f"admission: budget {a['budget_mb']} MB, fourth slot refused: {a['reason']}; download events "
        f"{a['download_events']}, bundle bytes fetched {a['bundle_bytes_fetched']}: {'met' if a['met'] else 'NOT met'}",
        idle_line(r.get("idle")),
        f"load average: start {load['start'][0]:.1f}, median during modes {load['median_1min_during_modes']:.1f}, "
        f"end {load['end'][0]:.1f} (1 min; {r['cpus']} cores)",
    ]
    return "\n".join(lines)


def idle_line(idle: dict[str, Any] | None) -> str:
    if idle is None:
        return "idle: not measured (--idle-seconds 0)"
    return (f"idle, three slots loaded: {idle['pct_of_core']:.2f} % of a core over {idle['seconds']} s (goal <= "
            f"{idle['goal_pct']:g} %): {'met' if idle['met'] else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
