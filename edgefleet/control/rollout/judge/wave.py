"""Judging a wave from telemetry: pure functions over the reports devices sent, tested with tables.

A device's reports are summarised (`summarize`) for the bundle it ran before the wave (the baseline,
measured on the same device just before it is touched) and for the new bundle after it committed; then
`judge_device` compares them against the rollout's thresholds.

Latency is judged noise-aware (judge/latency.py): it fails only when the samples in hand show the new bundle over
the limit with confidence, and a device with no baseline of its own is judged against the bundle's own measurement
for its profile. No criterion passes blind. A criterion that lacks data (too few requests, no golden result, too
little labelled feedback) is `pending`: the wave waits for it, and when the wave's time is up `settle` turns it
into a failure, "no data for latency: …", unless the operator started the rollout allowing that criterion to
stay unjudged (`--allow-unjudged latency`, recorded in the rollout). Requests the agent generates from its golden
set when live traffic is thin (`probe_requests`; their latency is in the device's latency summary) count as data.

The agent's p95 is computed over a rolling window of its latest requests, which may still hold requests
served by the previous bundle just after a swap. A report's window is "fresh" to the share of requests
served since the new bundle started (requests counted since then / samples in the window); p95 values are
used only from reports at least `min_fresh_share` fresh. When the newer bundle is slower, the slow samples
are the top of a mixed window, so a half-fresh window's p95 is already the new bundle's p90.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from edgefleet.control.rollout.judge.drift import drift, drift_figures
from edgefleet.control.rollout.judge.evidence import JUDGED, Criterion, Finding, Metrics, Thresholds, check_thresholds
from edgefleet.control.rollout.judge.latency import Measured, Scaled, judge_latency
from edgefleet.control.rollout.judge.quality import field_accuracy, golden, quality_figures
from edgefleet.control.store import QualityPoint, TelemetryPoint

DRIFT_MIN_SAMPLES = 20  # a window of fewer samples moves on every request: not the device's drift


def summarize(
    points: Sequence[TelemetryPoint], *, bundle_id: str | None, since: float, fresh_since: float | None = None,
    min_fresh_share: float = 0.5, quality: Sequence[QualityPoint] = (),
) -> Metrics:  # fmt: skip
    """Reports of `bundle_id` whose whole window lies after `since`, oldest first.

    `fresh_since`: when the bundle started serving (None: long enough ago that every window is fresh).
    `quality`: the same reports' quality figures (probes, golden scores per output, field accuracy).
    """
    chosen = [p for p in points if p.bundle_id == bundle_id and p.ts - p.window_s >= since - 1e-6]
    chosen.sort(key=lambda p: p.ts)
    kept = {(p.seq, p.ts) for p in chosen}
    figures = [q for q in quality if q.bundle_id == bundle_id and (q.seq, q.ts) in kept]
    probes = {(q.seq, q.ts): q.probe_requests for q in figures}
    served = 0
    fresh_p95: list[float] = []
    fresh_p50: list[float] = []
    fresh_n: list[int] = []
    settled_p50: list[float] = []  # p50s of windows past their first few samples: what drift is measured on
    for point in chosen:
        served += point.requests + point.errors + probes.get((point.seq, point.ts), 0)
        if point.p95_ms is None or point.latency_count <= 0:
            continue
        if fresh_since is None or served / point.latency_count >= min_fresh_share:
            fresh_p95.append(point.p95_ms)
            fresh_n.append(point.latency_count)
            if point.p50_ms is not None:
                fresh_p50.append(point.p50_ms)
                if point.latency_count >= DRIFT_MIN_SAMPLES:
                    settled_p50.append(point.p50_ms)
    goldens = [p.golden_agreement for p in chosen if p.golden_agreement is not None]
    return Metrics(
        bundle_id=bundle_id,
        reports=len(chosen),
        requests=sum(p.requests for p in chosen),
        errors=sum(p.errors for p in chosen),
        p95_ms=round(statistics.median(fresh_p95), 6) if fresh_p95 else None,
        p50_ms=round(statistics.median(fresh_p50), 6) if fresh_p50 else None,
        latency_samples=int(statistics.median(fresh_n)) if fresh_n else 0,
        p50_drift_ms=round(max(settled_p50) - min(settled_p50), 6) if settled_p50 else 0.0,
        fresh_reports=len(fresh_p95),
        golden_agreement=min(goldens) if goldens else None,
        **quality_figures(figures),
        **drift_figures(figures),
    )


def judge_device(
    baseline: Metrics | None, observed: Metrics, t: Thresholds, measured: Measured | None = None,
    final: bool = True, *, scaled: Scaled | None = None, floor_from: str = "",
) -> list[Finding]:  # fmt: skip
    """Each enabled criterion for one device. `measured`: the bundle's own latency for the device's profile
    (judge/latency.py), the baseline where the device has none; `final`: the observe window has ended (latency is
    judged slower only then). Another model than the device ran has no baseline there (`baseline` None): its
    latency is judged against its own measurement `scaled` to the device, its golden figures against its own floor
    (`t.min_golden_agreement`, set by `floor_from`)."""
    return [
        f
        for f in (
            judge_latency(baseline, observed, t, measured, final, scaled),
            golden(baseline, observed, t, floor_from=floor_from), _errors(observed, t),
            field_accuracy(baseline, observed, t), drift(observed, t),
        )
        if f is not None
    ]  # fmt: skip


def settle(findings: Sequence[Finding], allowed: Iterable[Criterion] = ()) -> list[Finding]:
    """The wave's time is up: a criterion still lacking data fails, unless the operator allowed it unjudged."""
    allow = set(allowed)
    settled = []
    for f in findings:
        if f.ok is None and f.pending:
            reason = f.detail.removeprefix("not judged: ")
            if f.criterion in allow:
                f = f.model_copy(update={"pending": False, "detail": f"not judged, allowed by the operator: {reason}"})
            else:
                hint = f"; to pass it unjudged: --allow-unjudged {f.criterion}" if f.criterion in JUDGED else ""
                hint += (", or" if hint else "; to wait longer:") + " a longer --report-timeout"
                f = f.model_copy(
                    update={"ok": False, "pending": False, "detail": f"no data for {f.criterion}: {reason}{hint}"}
                )
        settled.append(f)
    return settled


def _errors(observed: Metrics, t: Thresholds) -> Finding | None:
    if t.max_error_rate is None:
        return None
    total = observed.volume
    rate = observed.error_rate
    if rate is None or total < t.min_requests:
        return _lacking("errors", f"{total} requests seen, {t.min_requests} needed")
    ok = rate <= t.max_error_rate
    verb = "within" if ok else "exceeds"
    probes = f", {observed.probe_requests} of them probes" if observed.probe_requests else ""
    return Finding(
        criterion="errors",
        ok=ok,
        detail=f"error rate {rate:.2%} ({observed.errors}/{total}{probes}) {verb} the limit {t.max_error_rate:.2%}"
        + ("" if ok else "; the device's own answers on the new bundle; to allow it: --max-error-rate"),
    )


def _lacking(criterion: Criterion, why: str) -> Finding:
    return Finding(criterion=criterion, ok=None, pending=True, detail=f"not judged: {why}")


def breached(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok is False]


def pending(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok is None and f.pending]


__all__ = [
    "JUDGED",
    "Criterion",
    "Finding",
    "Metrics",
    "Thresholds",
    "breached",
    "check_thresholds",
    "judge_device",
    "pending",
    "settle",
    "summarize",
]
