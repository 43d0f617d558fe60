"""The model-quality part of bench/serve.py: what drift statistics and a shadow model cost the served requests.

    python bench/serve.py --quality-only [--json]

Measured in process on the agent's own request path (LoadedModel.run, then FieldAccuracy.remember, which feeds
the drift monitor and the shadow), one closed-loop client thread, the worker threads (drift, shadow) running as
in the agent. Blocks of calls alternate between the cases (A, B, A, B, ...) so a noisy neighbour slows both
alike; the figure is the median per-call latency (p50) over every call of each case.
  1. drift on vs off: p50 added (goal ≤ 3 %), beside an A/A control (drift off twice) that shows the noise;
  2. memory for drift state: the window (ring of per-request bin counts and totals) measured by its arrays and
     by tracemalloc after a full window, plus the bound of the request queue;
  3. a shadow (a second session of the same bundle) mirroring 10 % and 100 % of requests under the default CPU
     budget (0.25 core) and at 100 % with one whole core: served p50 against no shadow, mirrored and dropped.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.quality.drift import DriftConfig, DriftMonitor, load_reference
from edgefleet.agent.quality.feedback import FieldAccuracy
from edgefleet.agent.quality.shadow import ShadowConfig, ShadowRunner
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.quality.golden import checks_for

Call = Callable[[], object]


def _served(model: LoadedModel, field: FieldAccuracy, feeds: dict[str, np.ndarray]) -> Call:
    name, bundle_id = model.manifest.model_name, model.bundle_id

    def call() -> object:
        outputs = model.run(feeds)
        return field.remember(name, outputs, bundle_id=bundle_id, inputs=feeds)

    return call


def alternating_p50(cases: dict[str, Call], blocks: int = 30, calls: int = 300) -> dict[str, float]:
    """Median per-call µs of each case over every call, blocks alternating between the cases."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm-up
        for _ in range(calls):
            fn()
    names = list(cases)
    for block in range(blocks):
        for name in names[block % len(names) :] + names[: block % len(names)]:
            fn, out = cases[name], samples[name]
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    return {name: float(np.median(v)) * 1e6 for name, v in samples.items()}


def bench_drift(bundle: Path, manifest: Manifest, samples: list[dict[str, np.ndarray]], threads: int) -> dict[str, Any]:
    model = LoadedModel(bundle, manifest, threads)
    reference = load_reference(bundle, manifest.drift_reference)
    if reference is None:
        return {"error": "the bundle carries no drift reference"}
    plain, control, watched = FieldAccuracy(), FieldAccuracy(), FieldAccuracy()
    monitor = DriftMonitor(reference, DriftConfig())
    watched.observe(lambda _n, _b, inputs, outputs: monitor.observe(inputs, outputs))
    index = [0]

    def rotating(field: FieldAccuracy) -> Call:
        calls = [_served(model, field, s) for s in samples]

        def call() -> object:
            index[0] = (index[0] + 1) % len(calls)
            return calls[index[0]]()

        return call

    cases = {"drift off": rotating(plain), "drift on": rotating(watched), "drift off (A/A control)": rotating(control)}
    p50 = alternating_p50(cases, blocks=40, calls=300)
    monitor.close()
    binned_share = 1 - monitor.skipped / max(1, monitor.observed)
    added = p50["drift on"] - p50["drift off"]
    noise = p50["drift off (A/A control)"] - p50["drift off"]

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fresh = DriftMonitor(reference, DriftConfig())
    for i in range(DriftConfig().window):
        feeds = samples[i % len(samples)]
        fresh.observe(feeds, model.run(feeds))
        if i % 16 == 15:
            fresh.drain()  # the whole window binned, none skipped: the state at its fullest
    fresh.drain()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    request_bytes = sum(v.nbytes for v in samples[0].values()) + sum(v.nbytes for v in model.run(samples[0]).values())
    window = DriftConfig().window
    result = {
        "p50_us": p50,
        "added_us": added,
        "added_pct": 100 * added / p50["drift off"],
        "a_a_noise_pct": 100 * noise / p50["drift off"],
        "binned_share_at_full_load": binned_share,
        "window_requests": window,
        "features": len(reference.features),
        "state_bytes": fresh.memory_bytes(),
        "tracemalloc_bytes_after_full_window": held,
        "queue_bound_bytes": DriftConfig().queue * request_bytes,
        "requests_seen": fresh.observed,
    }
    fresh.close()
    model.close()
    return result


def bench_shadow(
    bundle: Path, manifest: Manifest, samples: list[dict[str, np.ndarray]], threads: int
) -> dict[str, Any]:
    model = LoadedModel(bundle, manifest, threads)
    shadow_model = LoadedModel(bundle, manifest, threads)
    checks = {c.output: c for c in checks_for(model.golden, manifest.golden)}
    cases: dict[str, Call] = {}
    runners: dict[str, ShadowRunner] = {}
    plain = FieldAccuracy()
    cases["no shadow"] = _served(model, plain, samples[0])
    for label, share, budget in (("10 %, 0.25 core", 0.1, 0.25), ("100 %, 0.25 core", 1.0, 0.25),
                                 ("100 %, 1 core", 1.0, 1.0)):  # fmt: skip
        runner = ShadowRunner("shadow", shadow_model.run, checks, ShadowConfig(share=share, cpu_budget=budget))
        field = FieldAccuracy()
        field.observe(lambda _n, _b, inputs, outputs, r=runner: r.offer(inputs, outputs))  # type: ignore[misc]
        cases[label] = _served(model, field, samples[0])
        runners[label] = runner
    p50 = alternating_p50(cases, blocks=24, calls=300)
    base = p50["no shadow"]
    result: dict[str, Any] = {"no shadow p50_us": base}
    for label, runner in runners.items():
        report = runner.report()
        runner.close()
        result[label] = {
            "p50_us": p50[label], "added_pct": 100 * (p50[label] - base) / base, "mirrored": report.requests,
            "dropped": report.dropped, "agreement": report.agreement,
            "shadow_p50_ms": report.latency.p50_ms if report.latency else None,
        }  # fmt: skip
    model.close()
    shadow_model.close()
    return result


def bench_quality(bundle: Path, manifest: Manifest, threads: int) -> dict[str, Any]:
    from edgefleet.core.quality.golden import GoldenSet

    golden = GoldenSet.load(bundle / manifest.golden.path, manifest.inputs, manifest.outputs)
    samples = list(golden.inputs.samples())
    return {
        "drift": bench_drift(bundle, manifest, samples, threads),
        "shadow": bench_shadow(bundle, manifest, samples, threads),
    }


def quality_rows(q: dict[str, Any]) -> list[tuple[str, str, str, str, bool]]:
    """Rows for bench/serve.py's table: (what, detail, figure, goal, met)."""
    rows: list[tuple[str, str, str, str, bool]] = []
    drift = q["drift"]
    if "error" not in drift:
        p50 = drift["p50_us"]
        rows.append(("drift statistics on the request path: p50 added",
                     f"{p50['drift on']:.2f} µs vs {p50['drift off']:.2f} µs (A/A {drift['a_a_noise_pct']:+.2f} %, "
                     f"{100 * drift['binned_share_at_full_load']:.1f} % binned)",
                     f"{drift['added_pct']:+.2f} %", "≤ 3 %", drift["added_pct"] <= 3.0))  # fmt: skip
        rows.append((f"drift state ({drift['window_requests']} requests, {drift['features']} features)",
                     f"tracemalloc {drift['tracemalloc_bytes_after_full_window'] / 1024:.1f} KiB, "
                     f"queue bound {drift['queue_bound_bytes'] / 1024:.1f} KiB",
                     f"{drift['state_bytes'] / 1024:.1f} KiB", "bounded", True))  # fmt: skip
    shadow = q["shadow"]
    for label, row in shadow.items():
        if isinstance(row, dict):
            rows.append((f"shadow {label}: served p50", f"{row['p50_us']:.2f} µs vs {shadow['no shadow p50_us']:.2f} µs"
                         f" ({row['mirrored']} mirrored, {row['dropped']} dropped)", f"{row['added_pct']:+.2f} %",
                         "report", True))  # fmt: skip
    return rows
