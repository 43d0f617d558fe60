"""Model quality at a glance, for the command line and the dashboard: one device's latest quality figures
reduced to a row (worst golden output, field accuracy, worst drift band, shadow against served)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgefleet.control.store import QualityPoint, band_rank
from edgefleet.core.messages import DriftScore, GoldenTask, OutputScore, ShadowReport, Telemetry


@dataclass(frozen=True)
class QualityRow:
    golden_min: float | None = None
    golden_output: str | None = None
    golden_failed: tuple[str, ...] = ()
    field_accuracy: float | None = None
    field_samples: int = 0
    drift_band: str | None = None
    drift_psi: float | None = None
    drift_name: str | None = None
    shadow_bundle: str | None = None
    shadow_agreement: float | None = None
    shadow_requests: int = 0
    shadow_p95_ms: float | None = None
    probe_requests: int = 0

    @property
    def empty(self) -> bool:
        return self == QualityRow()


def summarize_quality(
    golden: Sequence[OutputScore], drift: Sequence[DriftScore], shadow: ShadowReport | None,
    field_accuracy: float | None, field_samples: int, probe_requests: int,
) -> QualityRow:  # fmt: skip
    worst_golden = min(golden, key=lambda s: s.score, default=None)
    worst_drift = max(drift, key=lambda d: (band_rank(d.band), d.psi), default=None)
    return QualityRow(
        golden_min=worst_golden.score if worst_golden else None,
        golden_output=worst_golden.output if worst_golden else None,
        golden_failed=tuple(s.output for s in golden if not s.passed),
        field_accuracy=field_accuracy if field_samples else None,
        field_samples=field_samples,
        drift_band=worst_drift.band if worst_drift else None,
        drift_psi=worst_drift.psi if worst_drift else None,
        drift_name=f"{worst_drift.kind} {worst_drift.name}" if worst_drift else None,
        shadow_bundle=shadow.bundle_id if shadow else None,
        shadow_agreement=shadow.agreement if shadow else None,
        shadow_requests=shadow.requests if shadow else 0,
        shadow_p95_ms=shadow.latency.p95_ms if shadow and shadow.latency else None,
        probe_requests=probe_requests,
    )


def of_telemetry(t: Telemetry) -> QualityRow:
    return summarize_quality(t.golden_scores, t.drift, t.shadow, t.field_accuracy, t.field_samples, t.probe_requests)


def of_point(q: QualityPoint) -> QualityRow:
    return summarize_quality(q.golden, q.drift, q.shadow, q.field_accuracy, q.field_samples, q.probe_requests)


def latest_task(points: Sequence[QualityPoint]) -> GoldenTask | None:
    """The newest report's task rule score (points oldest first)."""
    return next((p.golden_task for p in reversed(points) if p.golden_task is not None), None)


def task_cell(task: GoldenTask | None) -> str:
    """The task rule as the device's golden check applied it, for a table cell; "" where none was reported."""
    if task is None:
        return ""
    if not task.computable or task.score is None or task.floor is None:
        return f"{task.metric} (not computable on the device: per-output checks judged)"
    verdict = "meets" if task.passed else "below"
    return f"{task.metric} {task.score:.4g} {verdict} floor {task.floor:.4g}"


def quality_cells(q: QualityRow) -> tuple[str, str, str, str]:
    """(golden, field accuracy, drift, shadow) as short table cells; "" where the device reports nothing."""
    golden = ""
    if q.golden_min is not None:
        golden = f"{q.golden_min:.4f} {q.golden_output}"
        if q.golden_failed:
            golden += f" FAIL({', '.join(q.golden_failed)})"
    field = f"{q.field_accuracy:.3f} (n={q.field_samples})" if q.field_accuracy is not None else ""
    drift = f"{q.drift_band} {q.drift_psi:.3f} {q.drift_name}" if q.drift_band is not None else ""
    shadow = ""
    if q.shadow_bundle is not None:
        agreement = f"{q.shadow_agreement:.4f}" if q.shadow_agreement is not None else "-"
        shadow = f"{q.shadow_bundle}: {agreement} over {q.shadow_requests}"
    return golden, field, drift, shadow


def any_quality(rows: Iterable[QualityRow]) -> bool:
    return any(not r.empty for r in rows)
