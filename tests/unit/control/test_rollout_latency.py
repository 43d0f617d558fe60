"""The noise-aware latency criterion (judge/latency.py) as a table: a breach must be shown with confidence by the
samples in hand, only once the observe window ends; a device without a baseline is judged against the bundle's
own measurement for its profile."""

from __future__ import annotations

import pytest

from edgefleet.control.rollout.judge.evidence import Metrics, Thresholds
from edgefleet.control.rollout.judge.latency import judge_latency

T = Thresholds()


def m(p50: float, p95: float, samples: int = 200, requests: int = 200, drift: float = 0.0) -> Metrics:
    return Metrics(bundle_id="b", reports=5, requests=requests, errors=0, p95_ms=p95, p50_ms=p50, fresh_reports=5,
                   golden_agreement=1.0, latency_samples=samples, p50_drift_ms=drift)  # fmt: skip


BASE = m(0.50, 0.60)


@pytest.mark.parametrize(
    ("baseline", "observed", "final", "ok", "says"),
    [
        (BASE, m(0.52, 0.63), True, True, "p95 0.630 ms within 1.5 × baseline 0.600 ms = 0.900 ms"),
        (BASE, m(0.52, 0.80, samples=60), True, True, "p95 0.800 ms within its noise (60 samples against 200"),
        (BASE, m(1.00, 1.20), True, False, "p95 1.200 ms (at least"),  # truly 2x slower
        (BASE, m(1.00, 1.20), False, None, "over the limit so far"),  # ... but only once the window ends
        (BASE, m(0.60, 3.00, samples=24), True, None, "within the noise of 24 samples"),  # a warm-up tail
        (BASE, m(0.90, 1.00, samples=24), True, False, "p50 0.900 ms"),  # a moved centre shows early
        (m(0.50, 0.60, drift=0.3), m(0.90, 1.00), True, True, "+ its drift 0.300 ms"),  # the device's own swings
        (BASE, m(0.9, 1.05, samples=1000), True, False, "p95 1.050 ms (at least"),
        (m(0.5, 0.6, requests=5), m(0.5, 0.6), True, None, "no baseline p95"),  # neither a baseline nor a figure
        (BASE, m(0.5, 0.6, requests=5), True, None, "5 requests served on the new bundle, 20 needed"),
    ],
    ids=["a-a", "a-a-few-samples", "2x-slower", "2x-slower-early", "warm-up-tail", "moved-centre",
         "drifting-device", "tail-1.75x", "no-baseline", "too-few-requests"],
)  # fmt: skip
def test_latency(baseline: Metrics, observed: Metrics, final: bool, ok: bool | None, says: str) -> None:
    finding = judge_latency(baseline, observed, T, final=final)
    assert finding is not None
    assert finding.ok is ok, finding.detail
    assert says in finding.detail, finding.detail
    assert finding.pending is (ok is None)


@pytest.mark.parametrize(
    ("measured", "observed", "ok", "says"),
    [
        ((0.3, "farm", "the farm's generic-x86-64 devices"), m(0.6, 0.7), True,
         "within 1.5 × 3 × 0.300 + a quiet device's call 1.000 ms = 2.350 ms"),
        ((0.3, "farm", "the farm's generic-x86-64 devices"), m(3.0, 3.5), False, "exceeds 1.5 × 3 × 0.300"),
        ((0.03, "build", "the build (host)"), m(0.26, 0.3), True, "within 1.5 × 10 × 0.030"),  # cold probes
        # CI, loaded: probes one every 0.5 s wake the runtime's threads, 17× the build's back-to-back figure
        ((0.018, "build", "the build (host)"), m(0.303, 0.366), True, "within 1.5 × 10 × 0.018"),
        ((0.03, "build", "the build (host)"), m(2.0, 2.5), False, "exceeds 1.5 × 10 × 0.030"),
    ],
    ids=["farm-ok", "farm-slow", "build-ok", "quiet-device-tiny-model", "build-slow"],
)  # fmt: skip
def test_a_first_install_is_judged_against_the_bundles_own_measurement(
    measured: tuple[float, str, str], observed: Metrics, ok: bool, says: str
) -> None:
    for baseline in (None, m(0.5, 0.6, requests=3)):  # no previous bundle, or one with too few samples
        finding = judge_latency(baseline, observed, T, measured)  # type: ignore[arg-type]
        assert finding is not None and finding.ok is ok, finding.detail
        assert says in finding.detail and "no baseline on the device" in finding.detail
