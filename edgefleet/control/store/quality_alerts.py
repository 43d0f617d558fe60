"""When a device's model quality changes state: pure functions from a report and the device's last states to the
alerts the control plane raises (tested with tables).

A subject is one drift score (`drift:input:pixels`, state = its band: none, moderate, drift) or one output's
golden check (`golden:logits`, state pass or fail). An alert is raised when a subject's state changes; a subject
seen for the first time raises one only when it is not in its good state already.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.core.messages import DriftBand, Telemetry

_BAND_RANK: dict[str, int] = {"none": 0, "moderate": 1, "drift": 2}
_BAND_LEVEL = {"none": "info", "moderate": "warning", "drift": "critical"}
_GOOD = {"drift": "none", "golden": "pass"}


@dataclass(frozen=True)
class QualityAlert:
    device_id: str
    ts: float
    kind: str  # "drift" or "golden"
    subject: str
    level: str  # info, warning, critical
    bundle_id: str | None
    detail: str


def drift_subject(kind: str, name: str) -> str:
    return f"drift:{kind}:{name}"


def subject_states(report: Telemetry) -> dict[str, str]:
    """subject → state, for every drift score and golden output in the report."""
    states: dict[str, str] = {drift_subject(d.kind, d.name): d.band for d in report.drift}
    states.update({f"golden:{s.output}": "pass" if s.passed else "fail" for s in report.golden_scores})
    return states


def band_rank(band: DriftBand | str) -> int:
    return _BAND_RANK.get(band, 0)


def transitions(report: Telemetry, previous: dict[str, str]) -> list[QualityAlert]:
    """The alerts this report raises, given each subject's previous state (absent: never seen)."""
    alerts = []
    for score in report.drift:
        subject = drift_subject(score.kind, score.name)
        before = previous.get(subject)
        if before == score.band or (before is None and score.band == "none"):
            continue
        direction = "rose" if band_rank(score.band) > band_rank(before or "none") else "fell"
        alerts.append(
            QualityAlert(
                report.device_id, report.ts, "drift", subject, _BAND_LEVEL[score.band], report.bundle_id,
                f"{score.kind} {score.name} drift {direction} to {score.band} (PSI {score.psi:.3f}"
                f"{f', KS {score.ks:.3f}' if score.ks is not None else ''}, {score.samples} samples; "
                f"was {before or 'unseen'})",
            )
        )  # fmt: skip
    for golden in report.golden_scores:
        subject = f"golden:{golden.output}"
        state = "pass" if golden.passed else "fail"
        before = previous.get(subject)
        if before == state or (before is None and state == _GOOD["golden"]):
            continue
        verb = "fails" if state == "fail" else "passes again"
        alerts.append(
            QualityAlert(
                report.device_id, report.ts, "golden", subject, "critical" if state == "fail" else "info",
                report.bundle_id, f"golden check of output {golden.output} {verb}: {golden.rule} score "
                f"{golden.score:.4f} on {report.bundle_id}",
            )
        )  # fmt: skip
    return alerts
