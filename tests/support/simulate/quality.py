"""What a simulated device reports about model quality, per bundle (`QualityBehavior`): per-output golden scores,
field accuracy, drift, probe requests when it has no client traffic, and a shadow's figures when its desired
state names a shadow bundle. The numbers are set by the test, which makes a quality breach exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgefleet.core.messages import DriftScore, GoldenTask, LatencySummary, OutputScore, ShadowReport


@dataclass(frozen=True)
class QualityBehavior:
    golden_scores: tuple[OutputScore, ...] = ()
    golden_task: GoldenTask | None = None
    field_accuracy: float | None = None
    field_samples: int = 0
    drift: tuple[DriftScore, ...] = ()
    shadow_agreement: float = 1.0  # when this bundle runs as a shadow: its agreement with the served one
    shadow_latency_factor: float = 1.0


@dataclass
class ShadowState:
    bundle_id: str
    mirrored: int = 0


def quality_fields(
    active: QualityBehavior, shadow: ShadowState | None, shadow_behavior: QualityBehavior | None, *, requests: int,
    probes: int, p95_ms: float | None,
) -> dict[str, Any]:  # fmt: skip
    """Telemetry fields for one report."""
    fields: dict[str, Any] = {
        "golden_scores": list(active.golden_scores), "golden_task": active.golden_task, "drift": list(active.drift),
        "probe_requests": probes, "field_accuracy": active.field_accuracy, "field_samples": active.field_samples,
    }  # fmt: skip
    if shadow is not None:
        behavior = shadow_behavior or QualityBehavior()
        shadow.mirrored += requests
        p95 = p95_ms * behavior.shadow_latency_factor if p95_ms is not None else None
        fields["shadow"] = ShadowReport(
            bundle_id=shadow.bundle_id, requests=shadow.mirrored,
            agreement=behavior.shadow_agreement if shadow.mirrored else None,
            latency=LatencySummary(count=shadow.mirrored, p50_ms=p95, p95_ms=p95, p99_ms=p95) if p95 else None,
        )  # fmt: skip
    return fields
