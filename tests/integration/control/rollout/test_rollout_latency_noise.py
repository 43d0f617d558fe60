"""The latency criterion against real noise: A/A rollouts of the same weights never fail on latency, a bundle truly
2× slower does.

A quiet device is judged by its golden-set probes. Here a device is the agent's own `Prober` and `RequestStats`
(agent/quality/probe.py, agent/telemetry/stats.py) running a real onnxruntime session of a sub-millisecond model,
its telemetry summaries taken as the reporter takes them; each "rollout" loads a fresh session of the next bundle
(cold, as an install is), resets the latency window as the agent does on a swap, and the rollout judge
(`summarize` + `judge_device`, judge/latency.py) judges it at every report after the install against the reports
of the previous bundle, as the engine does: before the observe window ends (here: two thirds of the bundle's
reports) a breach is only pending, after it any breach fails the wave. The noise is this machine's, loaded as it
is, with probes 50 times as dense as the agent's default (load bursts hit many more of them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import pytest

from edgefleet.agent.quality.probe import ProbeConfig, Prober
from edgefleet.agent.telemetry.stats import RequestStats
from edgefleet.control.rollout.judge.evidence import Finding, Thresholds
from edgefleet.control.rollout.judge.wave import breached, judge_device, summarize
from edgefleet.control.store import QualityPoint, TelemetryPoint
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.tensors import Dataset

from support.models.timing import matmul_chain

pytestmark = pytest.mark.slow

SIZE, DEPTH = 512, 12  # about 0.5-0.8 ms a probe on these machines
PROBE_RATE = 100.0  # probes per second (the agent's default is 2: the same code, a shorter test)
PROBES_PER_BUNDLE = 150
REPORT_EVERY_S = 0.15
T = Thresholds()  # the defaults: factor 1.5, no slack, 20 requests, 99% confidence


@dataclass
class Device:
    """What the engine reads of one device: its reports, tagged by bundle."""

    points: list[TelemetryPoint]
    quality: list[QualityPoint]


class Model:
    """A loaded bundle as the prober sees it: the golden inputs and a real session."""

    def __init__(self, depth: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(
            matmul_chain(SIZE, depth).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        inputs = np.random.default_rng(depth).normal(size=(8, SIZE)).astype(np.float32)
        self.golden = GoldenSet(Dataset({"x": inputs[:, None, :]}, None), {}, {})

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (out,) = self.session.run(None, feeds)
        return {"y": out}


def serve(device: Device, bundle: str, depth: int, seq: list[int]) -> None:
    """Install `bundle` (load, run the golden set once, reset the window), then probe and report."""
    model = Model(depth)
    for i in range(len(model.golden.inputs)):
        model.run(model.golden.inputs.sample(i))  # the install's golden check
    stats = RequestStats()
    stats.reset_health()
    prober = Prober(lambda: model, stats, ProbeConfig(rate=PROBE_RATE, min_live=10, idle_s=10.0))
    probed = 0
    done = threading.Event()

    def probe() -> None:
        nonlocal probed
        while probed < PROBES_PER_BUNDLE and not done.wait(1.0 / PROBE_RATE):
            prober.probe_once()
            probed += 1
        done.set()

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    while not done.wait(REPORT_EVERY_S) or worker.is_alive():
        latency, requests, errors, window_s = stats.snapshot()
        probes = stats.take_probes()
        seq[0] += 1
        ts = time.time()
        device.points.append(TelemetryPoint(
            "d", seq[0], ts, bundle, "CPUExecutionProvider", window_s, requests, errors, latency.p50_ms,
            latency.p95_ms, latency.p99_ms, latency.count, 1.0, 0.0, 0.0, 0.0, None,
        ))  # fmt: skip
        device.quality.append(QualityPoint("d", seq[0], ts, bundle, probe_requests=probes))
        if not worker.is_alive():
            break


def judged(device: Device, previous: str, bundle: str) -> list[list[Finding]]:
    """The latency findings at every report of `bundle` after its install, against `previous`'s reports; the
    observe window ends at two thirds of them."""
    old = [p for p in device.points if p.bundle_id == previous]
    baseline = summarize(old, bundle_id=previous, since=old[0].ts - 1, quality=device.quality)
    new = [p for p in device.points if p.bundle_id == bundle]
    installed = new[0].ts - new[0].window_s
    verdicts = []
    for count in range(2, len(new) + 1):  # min_reports 2
        observed = summarize(new[:count], bundle_id=bundle, since=installed, fresh_since=installed,
                             quality=device.quality)  # fmt: skip
        final = count >= len(new) * 2 // 3
        verdicts.append([f for f in judge_device(baseline, observed, T, final=final) if f.criterion == "latency"])
    return verdicts


def median_ms(depth: int) -> float:
    model = Model(depth)
    feeds = model.golden.inputs.sample(0)
    times = []
    for _ in range(200):
        start = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - start)
        time.sleep(1.0 / PROBE_RATE)
    return float(np.median(times)) * 1000


def test_twenty_a_a_rollouts_never_fail_on_latency_and_a_bundle_truly_twice_as_slow_does() -> None:
    # "truly 2x slower" as measured here, probed as a device probes: the depth that doubles the median
    # A median taken once on a loaded machine can be off by a load burst either way (a CI run measured 0.747 ms
    # after 2x had been found, against 0.438), so a candidate counts only against the slower of two base medians,
    # the second taken right after it, and the value kept is the one measured, not a third draw.
    base = median_ms(DEPTH)
    slow_depth, slow = DEPTH, base
    while slow_depth < DEPTH * 16:
        slow_depth += DEPTH
        slow = median_ms(slow_depth)
        if slow >= 2.2 * base:
            base = max(base, median_ms(DEPTH))
            if slow >= 2.0 * base:
                break
    assert slow >= 2.0 * base, f"no model twice as slow found: {base:.3f} ms vs {slow:.3f} ms"

    device, seq = Device([], []), [0]
    serve(device, "v0", DEPTH, seq)
    failures, passes, rows = [], 0, []
    for i in range(1, 21):  # 20 A/A rollouts: the same weights, a fresh install each time
        serve(device, f"v{i}", DEPTH, seq)
        verdicts = judged(device, f"v{i - 1}", f"v{i}")
        broke = [f for findings in verdicts for f in breached(findings)]
        final = verdicts[-1][0]
        rows.append((i, final.ok, final.detail))
        if broke:
            failures.append((i, broke[0].detail))
        passes += final.ok is True
    print(f"\nA/A: {len(failures)} of 20 waves failed on latency; {passes} passed at their last report")
    for row in rows:
        print(*row)
    assert not failures, failures
    assert passes >= 18, "A/A rollouts are judged (passed), not left pending"

    serve(device, "slow", slow_depth, seq)
    verdicts = judged(device, "v20", "slow")
    broke = [f for findings in verdicts for f in breached(findings)]
    print(f"2x slower ({base:.3f} → {slow:.3f} ms): {broke[0].detail if broke else verdicts[-1][0].detail}")
    assert broke, f"a bundle {slow / base:.2f}× slower passed: {verdicts[-1][0].detail}"
