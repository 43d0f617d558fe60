"""Judging a wave from telemetry: pure functions over the reports devices sent, tested with tables.

A device's reports are summarised (`summarize`) for the bundle it ran before the wave (the baseline,
measured on the same device just before it is touched) and for the new bundle after it committed; then
`judge_device` compares them against the rollout's thresholds.

The agent's p95 is computed over a rolling window of its latest requests, which may still hold requests
served by the previous bundle just after a swap. A report's window is "fresh" to the share of requests
served since the new bundle started (requests counted since then / samples in the window); p95 values are
used only from reports at least `min_fresh_share` fresh. When the newer bundle is slower, the slow samples
are the top of a mixed window, so a half-fresh window's p95 is already the new bundle's p90.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.control.store import TelemetryPoint

Criterion = Literal["reports", "latency", "golden", "errors", "install"]


class Metrics(BaseModel):
    """What a device's reports say about one bundle over one window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bundle_id: str | None
    reports: int = Field(description="telemetry reports in the window")
    requests: int = Field(description="requests served in the window")
    errors: int = Field(description="requests refused or failed in the window")
    p95_ms: float | None = Field(description="median over the fresh reports of the device's p95")
    fresh_reports: int = Field(description="reports whose latency window held mostly this bundle's requests")
    golden_agreement: float | None = Field(description="lowest golden agreement the device reported")

    @property
    def error_rate(self) -> float | None:
        total = self.requests + self.errors
        return self.errors / total if total else None


class Finding(BaseModel):
    """One criterion on one device: ok True/False, or None when it cannot be judged (yet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    criterion: Criterion
    ok: bool | None
    pending: bool = Field(default=False, description="not judged yet, but more data may settle it")
    detail: str


class Thresholds(BaseModel):
    """Per-wave success criteria; None switches a criterion off. Validated by `check_thresholds`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_latency_factor: float | None = Field(
        default=1.5, description="new p95 ≤ factor × the device's p95 on its previous bundle (≥ 1)"
    )
    latency_slack_ms: float = Field(default=0.0, description="absolute slack added to the latency limit")
    max_golden_drop: float | None = Field(
        default=0.01, description="golden agreement may fall at most this much below the previous bundle's"
    )
    min_golden_agreement: float | None = Field(default=None, description="absolute floor for golden agreement")
    max_error_rate: float | None = Field(default=0.01, description="errors / (requests + errors) at most this")
    min_requests: int = Field(default=20, description="requests a device must serve before latency/errors count")
    min_fresh_share: float = Field(default=0.5, description="see the module docstring")


def check_thresholds(t: Thresholds) -> list[str]:
    """Why these thresholds make no sense (empty when they do)."""
    problems = []
    if t.max_latency_factor is not None and not 1.0 <= t.max_latency_factor <= 1000:
        problems.append(
            f"max latency factor {t.max_latency_factor:g} must be between 1 and 1000: below 1 every bundle as fast "
            "as the previous one would fail"
        )
    if not 0 <= t.latency_slack_ms <= 60_000:
        problems.append(f"latency slack {t.latency_slack_ms:g} ms must be between 0 and 60000")
    if t.max_golden_drop is not None and not 0 <= t.max_golden_drop < 1:
        problems.append(f"max golden drop {t.max_golden_drop:g} must be in [0, 1): agreement is a share")
    if t.min_golden_agreement is not None and not 0 < t.min_golden_agreement <= 1:
        problems.append(f"min golden agreement {t.min_golden_agreement:g} must be in (0, 1]")
    if t.max_error_rate is not None and not 0 <= t.max_error_rate < 1:
        problems.append(f"max error rate {t.max_error_rate:g} must be in [0, 1): 1 would accept a bundle that fails")
    if t.min_requests < 1:
        problems.append(f"min requests {t.min_requests} must be at least 1")
    if not 0 < t.min_fresh_share <= 1:
        problems.append(f"min fresh share {t.min_fresh_share:g} must be in (0, 1]")
    return problems


def summarize(
    points: Sequence[TelemetryPoint], *, bundle_id: str | None, since: float, fresh_since: float | None = None,
    min_fresh_share: float = 0.5,
) -> Metrics:  # fmt: skip
    """Reports of `bundle_id` whose whole window lies after `since`, oldest first.

    `fresh_since`: when the bundle started serving (None: long enough ago that every window is fresh).
    """
    chosen = [p for p in points if p.bundle_id == bundle_id and p.ts - p.window_s >= since - 1e-6]
    chosen.sort(key=lambda p: p.ts)
    served = 0
    fresh_p95: list[float] = []
    for point in chosen:
        served += point.requests + point.errors
        if point.p95_ms is None or point.latency_count <= 0:
            continue
        if fresh_since is None or served / point.latency_count >= min_fresh_share:
            fresh_p95.append(point.p95_ms)
    goldens = [p.golden_agreement for p in chosen if p.golden_agreement is not None]
    return Metrics(
        bundle_id=bundle_id,
        reports=len(chosen),
        requests=sum(p.requests for p in chosen),
        errors=sum(p.errors for p in chosen),
        p95_ms=round(statistics.median(fresh_p95), 6) if fresh_p95 else None,
        fresh_reports=len(fresh_p95),
        golden_agreement=min(goldens) if goldens else None,
    )


def judge_device(baseline: Metrics | None, observed: Metrics, t: Thresholds) -> list[Finding]:
    """Each enabled criterion for one device of a wave."""
    return [
        f
        for f in (_latency(baseline, observed, t), _golden(baseline, observed, t), _errors(observed, t))
        if f is not None
    ]


def _latency(baseline: Metrics | None, observed: Metrics, t: Thresholds) -> Finding | None:
    factor = t.max_latency_factor
    if factor is None:
        return None
    if baseline is None or baseline.p95_ms is None or baseline.requests < t.min_requests:
        return Finding(criterion="latency", ok=None, detail="not judged: no baseline p95 (no traffic before the wave)")
    if observed.requests < t.min_requests or observed.p95_ms is None:
        pending = observed.requests > 0
        detail = f"not judged: {observed.requests} requests served on the new bundle, {t.min_requests} needed"
        if observed.requests >= t.min_requests:
            detail = "not judged: the device's latency window still holds mostly the previous bundle's requests"
            pending = True
        return Finding(criterion="latency", ok=None, pending=pending, detail=detail)
    limit = factor * baseline.p95_ms + t.latency_slack_ms
    ok = observed.p95_ms <= limit
    verb = "within" if ok else "exceeds"
    return Finding(
        criterion="latency",
        ok=ok,
        detail=f"p95 {observed.p95_ms:.3f} ms {verb} {factor:g} × baseline {baseline.p95_ms:.3f} ms = {limit:.3f} ms",
    )


def _golden(baseline: Metrics | None, observed: Metrics, t: Thresholds) -> Finding | None:
    floors = []
    if t.min_golden_agreement is not None:
        floors.append((t.min_golden_agreement, f"the floor {t.min_golden_agreement:.3f}"))
    if t.max_golden_drop is not None and baseline is not None and baseline.golden_agreement is not None:
        floor = baseline.golden_agreement - t.max_golden_drop
        floors.append((floor, f"baseline {baseline.golden_agreement:.3f} − {t.max_golden_drop:g} = {floor:.3f}"))
    if not floors:
        if t.max_golden_drop is None and t.min_golden_agreement is None:
            return None
        return Finding(criterion="golden", ok=None, detail="not judged: no golden baseline and no absolute floor")
    if observed.golden_agreement is None:
        return Finding(criterion="golden", ok=None, pending=True, detail="not judged: no golden result reported yet")
    floor, why = max(floors)
    ok = observed.golden_agreement >= floor - 1e-9
    verb = "meets" if ok else "is below"
    return Finding(criterion="golden", ok=ok, detail=f"golden agreement {observed.golden_agreement:.3f} {verb} {why}")


def _errors(observed: Metrics, t: Thresholds) -> Finding | None:
    if t.max_error_rate is None:
        return None
    total = observed.requests + observed.errors
    rate = observed.error_rate
    if rate is None or total < t.min_requests:
        return Finding(
            criterion="errors", ok=None, pending=total > 0,
            detail=f"not judged: {total} requests seen, {t.min_requests} needed",
        )  # fmt: skip
    ok = rate <= t.max_error_rate
    verb = "within" if ok else "exceeds"
    return Finding(
        criterion="errors",
        ok=ok,
        detail=f"error rate {rate:.2%} ({observed.errors}/{total}) {verb} the limit {t.max_error_rate:.2%}",
    )


def breached(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok is False]


def pending(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok is None and f.pending]


__all__ = ["Finding", "Metrics", "Thresholds", "breached", "check_thresholds", "judge_device", "pending", "summarize"]
