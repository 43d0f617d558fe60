"""What judging a wave works with: a device's figures for one bundle (`Metrics`), a verdict on one criterion
(`Finding`) and the thresholds (`Thresholds`). See `judge` for how they are computed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.core.quality.golden_hold import DEFAULT_MAX_GOLDEN_DROP

Criterion = Literal[
    "reports", "latency", "golden", "errors", "install", "field-accuracy", "shadow", "drift", "evidence"
]
# Criteria an operator may allow to pass unjudged when data lacks. "evidence" (judge/plausibility.py) is not one.
JUDGED: tuple[Criterion, ...] = ("latency", "golden", "errors", "field-accuracy", "shadow", "drift")


class Metrics(BaseModel):
    """What a device's reports say about one bundle over one window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bundle_id: str | None
    reports: int = Field(description="telemetry reports in the window")
    requests: int = Field(description="requests served in the window")
    errors: int = Field(description="requests refused or failed in the window")
    p95_ms: float | None = Field(description="median over the fresh reports of the device's p95")
    p50_ms: float | None = Field(default=None, description="median over the same reports of the device's p50")
    latency_samples: int = Field(default=0, description="median over the same reports of the samples behind them")
    p50_drift_ms: float = Field(
        default=0.0, description="how far the device's p50 moved between those reports (max - min): its own drift"
    )
    fresh_reports: int = Field(description="reports whose latency window held mostly this bundle's requests")
    golden_agreement: float | None = Field(description="lowest golden agreement the device reported")
    probe_requests: int = Field(default=0, description="requests the agent generated from its golden set")
    golden_scores: dict[str, float] = Field(default_factory=dict, description="lowest score per output")
    golden_failed: dict[str, str] = Field(default_factory=dict, description="output → why its golden check failed")
    field_accuracy: float | None = Field(default=None, description="the latest windowed field accuracy")
    field_samples: int = Field(default=0, description="labelled feedbacks behind field_accuracy")
    drift_psi: float | None = Field(default=None, description="worst drift PSI of the latest report with drift")
    drift_worst: str = Field(default="", description="the input or output behind drift_psi")
    drift_samples: int = Field(default=0, description="fewest live samples behind a score of that report")

    @property
    def volume(self) -> int:
        """Requests that tell about latency and errors: client requests, the device's probes and failures."""
        return self.requests + self.probe_requests + self.errors

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.volume if self.volume else None


class Finding(BaseModel):
    """One criterion on one device: ok True/False, or None when it cannot be judged. `pending`: it lacks data;
    the wave waits for it, and when the wave's time is up it fails (`settle`) unless the operator allowed it
    to stay unjudged. ok None without pending: the criterion does not apply (say, no feedback exists)."""

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
    latency_confidence: float = Field(
        default=0.99, description="latency fails only when the samples show it over the limit with this confidence"
    )
    farm_factor: float = Field(
        default=3.0, description="no baseline on the device: p50 ≤ max latency factor × this × the farm's median"
    )
    build_factor: float = Field(
        default=10.0,
        description="no baseline on the device nor a farm figure: p50 ≤ max latency factor × this × "
        "the build's median (another machine, maybe a proxy for the profile)",
    )
    quiet_call_ms: float = Field(
        default=1.0,
        description="no baseline on the device: added to the limit against the farm's or the build's median. "
        "Those are back-to-back timings; a request on a quiet device (its golden-set probes, one every 0.5 s) "
        "also pays for waking the runtime's threads (0.26 ms for the digits CNN on these machines, against "
        "0.024 ms back to back)",
    )
    max_golden_drop: float | None = Field(
        default=DEFAULT_MAX_GOLDEN_DROP,
        description="golden agreement may fall at most this much below the previous bundle's",
    )
    min_golden_agreement: float | None = Field(default=None, description="absolute floor for golden agreement")
    max_error_rate: float | None = Field(default=0.01, description="errors / (requests + errors) at most this")
    min_requests: int = Field(default=20, description="requests a device must serve before latency/errors count")
    min_fresh_share: float = Field(default=0.5, description="see the module docstring")
    max_field_accuracy_drop: float | None = Field(
        default=0.02, description="field accuracy may fall at most this much below the previous bundle's"
    )
    min_field_samples: int = Field(default=50, description="labelled feedbacks needed, before and after the wave")
    max_drift_psi: float | None = Field(
        default=None, description="the new bundle's worst drift PSI at most this (judge_drift.py); None: off"
    )
    min_drift_samples: int = Field(default=100, description="live samples behind every drift score before judging")
    max_speedup: float | None = Field(
        default=20.0,
        description="a device more than this many times faster than the bundle's own measurement for its profile "
        "(farm, else build) is an implausible report (judge/plausibility.py); None: not weighed",
    )
    max_link_bytes_per_s: float = Field(
        default=1e9, description="the fastest link a device can fetch a bundle over (bounds the install time)"
    )


def check_thresholds(t: Thresholds) -> list[str]:
    """Why these thresholds make no sense (empty when they do)."""
    problems = []
    if t.max_latency_factor is not None and not 1.0 <= t.max_latency_factor <= 1000:
        problems.append(
            f"max latency factor {t.max_latency_factor:g} must be between 1 and 1000: below 1 every bundle as fast "
            "as the previous one would fail"
        )
    if not 0.5 <= t.latency_confidence < 1:
        problems.append(f"latency confidence {t.latency_confidence:g} must be in [0.5, 1)")
    if not 1 <= t.farm_factor <= 1000 or not 1 <= t.build_factor <= 1000:
        problems.append(f"farm factor {t.farm_factor:g} and build factor {t.build_factor:g} must be between 1 and 1000")
    if not 0 <= t.quiet_call_ms <= 60_000:
        problems.append(f"quiet call allowance {t.quiet_call_ms:g} ms must be between 0 and 60000")
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
    if t.max_field_accuracy_drop is not None and not 0 <= t.max_field_accuracy_drop < 1:
        problems.append(f"max field accuracy drop {t.max_field_accuracy_drop:g} must be in [0, 1)")
    if t.min_field_samples < 1:
        problems.append(f"min field samples {t.min_field_samples} must be at least 1")
    if t.max_drift_psi is not None and not 0 < t.max_drift_psi <= 10:
        problems.append(f"max drift PSI {t.max_drift_psi:g} must be in (0, 10] (0.25 is the usual drift band)")
    if t.min_drift_samples < 1:
        problems.append(f"min drift samples {t.min_drift_samples} must be at least 1")
    if t.max_speedup is not None and not 2 <= t.max_speedup <= 10_000:
        problems.append(f"max speedup {t.max_speedup:g} must be between 2 and 10000: the bundle's own latency "
                        "measurement varies from device to device")  # fmt: skip
    if not 1e5 <= t.max_link_bytes_per_s <= 1e12:
        problems.append(f"max link bytes/s {t.max_link_bytes_per_s:g} must be between 1e5 and 1e12")
    return problems
