"""The model-quality criteria of a wave, pure functions like the rest of `judge`:

- golden: every output's golden check on the device (the rule and tolerances its manifest records per output
  kind: class agreement, per-position agreement, or SQNR/cosine/max-abs for continuous outputs) must pass, each
  output's score may fall at most `max_golden_drop` below the same output's score on the previous bundle, and
  the legacy golden agreement keeps its floors;
- field accuracy: where applications give labelled feedback, the new bundle's windowed field accuracy may fall
  at most `max_field_accuracy_drop` below the previous bundle's, each with `min_field_samples` feedbacks;
- shadow: a candidate run beside the served bundle on mirrored requests must agree with it and keep up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgefleet.control.rollout.judge.evidence import Finding, Metrics, Thresholds
from edgefleet.control.store import QualityPoint
from edgefleet.core.messages import ShadowReport


def quality_figures(points: Sequence[QualityPoint]) -> dict[str, Any]:
    """Metrics fields from the quality figures of a bundle's reports (oldest first)."""
    scores: dict[str, float] = {}
    failed: dict[str, str] = {}
    for point in points:
        for s in point.golden:
            scores[s.output] = min(scores.get(s.output, s.score), s.score)
            if not s.passed:
                failed[s.output] = f"{s.rule} score {s.score:.4f} outside the manifest's tolerance"
    labelled = [p for p in points if p.field_samples > 0 and p.field_accuracy is not None]
    latest = labelled[-1] if labelled else None
    return {
        "probe_requests": sum(p.probe_requests for p in points),
        "golden_scores": scores,
        "golden_failed": failed,
        "field_accuracy": latest.field_accuracy if latest else None,
        "field_samples": latest.field_samples if latest else 0,
    }


RECONVERT_HINT = (
    "reconvert with a tighter accuracy budget (edgefleet convert --max-drop) so a more precise recipe ships"
)
DROP_HINT = f"to allow it: --max-golden-drop, or {RECONVERT_HINT}"


def golden(
    baseline: Metrics | None, observed: Metrics, t: Thresholds, *, baseline_from: str = "", floor_from: str = ""
) -> Finding | None:
    """`baseline_from`: where the baseline's golden figures came from (default: the previous bundle on this
    device); `floor_from`: who set `t.min_golden_agreement` (default: the operator's --min-golden)."""
    if t.max_golden_drop is None and t.min_golden_agreement is None:
        return None
    if observed.golden_failed:
        output, why = sorted(observed.golden_failed.items())[0]
        more = f" (and {len(observed.golden_failed) - 1} more outputs)" if len(observed.golden_failed) > 1 else ""
        return Finding(
            criterion="golden", ok=False,
            detail=f"golden check of output {output} fails: {why}{more}; baseline: the tolerance the bundle's own "
            f"build signed into its manifest, checked by the device; to change it: {RECONVERT_HINT}",
        )  # fmt: skip
    source = baseline_from or (f"the previous bundle {baseline.bundle_id} on this device" if baseline else "")
    legacy = _agreement(baseline, observed, t, source, floor_from or "the operator's --min-golden")
    if legacy is not None and legacy.ok is False:
        return legacy
    drop = t.max_golden_drop
    if drop is not None and baseline is not None:
        for output, score in sorted(observed.golden_scores.items()):
            before = baseline.golden_scores.get(output)
            if before is not None and score < before - drop - 1e-9:
                return Finding(
                    criterion="golden", ok=False,
                    detail=f"golden score of output {output} {score:.4f} is below baseline {before:.4f} − {drop:g} "
                    f"= {before - drop:.4f}; baseline: {source}; {DROP_HINT}",
                )  # fmt: skip
    if observed.golden_scores and (legacy is None or legacy.ok is None):
        lowest, output = min((s, o) for o, s in observed.golden_scores.items())
        return Finding(
            criterion="golden", ok=True,
            detail=f"golden checks pass on {len(observed.golden_scores)} output(s), lowest score {lowest:.4f} "
            f"({output})",
        )  # fmt: skip
    return legacy


def _agreement(
    baseline: Metrics | None, observed: Metrics, t: Thresholds, source: str, floor_from: str
) -> Finding | None:
    floors = []
    if t.min_golden_agreement is not None:
        hint = f"to change it: {RECONVERT_HINT}" if "--min-golden" not in floor_from else "to change it: --min-golden"
        floors.append((t.min_golden_agreement, f"the floor {t.min_golden_agreement:.3f}; floor: {floor_from}; {hint}"))
    if t.max_golden_drop is not None and baseline is not None and baseline.golden_agreement is not None:
        floor = baseline.golden_agreement - t.max_golden_drop
        floors.append(
            (
                floor,
                f"baseline {baseline.golden_agreement:.3f} − {t.max_golden_drop:g} = {floor:.3f}; baseline: {source}; "
                f"{DROP_HINT}",
            )
        )
    if observed.golden_agreement is None:
        return Finding(criterion="golden", ok=None, pending=True, detail="not judged: no golden result reported yet")
    if not floors:
        return Finding(
            criterion="golden", ok=None, pending=True,
            detail="not judged: no golden baseline, no per-output golden scores and no absolute floor",
        )  # fmt: skip
    floor, why = max(floors)
    ok = observed.golden_agreement >= floor - 1e-9
    if ok:
        why = why.split("; ")[0]
    verb = "meets" if ok else "is below"
    return Finding(criterion="golden", ok=ok, detail=f"golden agreement {observed.golden_agreement:.3f} {verb} {why}")


def field_accuracy(baseline: Metrics | None, observed: Metrics, t: Thresholds) -> Finding | None:
    """Judged where feedback exists: the previous bundle had `min_field_samples` labelled answers."""
    drop, need = t.max_field_accuracy_drop, t.min_field_samples
    if drop is None:
        return None
    before = baseline.field_samples if baseline else 0
    if baseline is None or baseline.field_accuracy is None or before < need:
        if before == 0 and observed.field_samples == 0:
            return None  # no application gives feedback here: nothing to compare
        return Finding(
            criterion="field-accuracy", ok=None,
            detail=f"does not apply: {before} labelled feedbacks on the previous bundle, {need} needed to compare",
        )  # fmt: skip
    if observed.field_accuracy is None or observed.field_samples < need:
        return Finding(
            criterion="field-accuracy", ok=None, pending=True,
            detail=f"not judged: {observed.field_samples} labelled feedbacks on the new bundle, {need} needed",
        )  # fmt: skip
    floor = baseline.field_accuracy - drop
    ok = observed.field_accuracy >= floor - 1e-9
    verb = "meets" if ok else "is below"
    return Finding(
        criterion="field-accuracy", ok=ok,
        detail=f"field accuracy {observed.field_accuracy:.3f} ({observed.field_samples} feedbacks) {verb} baseline "
        f"{baseline.field_accuracy:.3f} − {drop:g} = {floor:.3f}",
    )  # fmt: skip


def judge_shadow(
    report: ShadowReport | None, served_p95_ms: float | None, *, min_requests: int, min_agreement: float,
    max_latency_factor: float | None, latency_slack_ms: float = 0.0,
) -> list[Finding]:  # fmt: skip
    """A shadow's figures on one device: agreement with the served bundle (worst output), and its p95 against
    the served bundle's. Too few mirrored requests, or no served p95, is pending (then fails when time is up)."""
    requests = report.requests if report else 0
    if report is None or report.agreement is None or requests < min_requests:
        return [
            Finding(
                criterion="shadow", ok=None, pending=True,
                detail=f"not judged: {requests} requests mirrored to the shadow, {min_requests} needed",
            )
        ]  # fmt: skip
    worst = min(report.per_output, key=lambda s: s.score, default=None)
    where = f" (worst output {worst.output}, {worst.rule})" if worst else ""
    ok = report.agreement >= min_agreement - 1e-9 and all(s.passed for s in report.per_output)
    verb = "meets" if ok else "is below"
    findings = [
        Finding(
            criterion="shadow", ok=ok,
            detail=f"shadow agreement {report.agreement:.4f}{where} {verb} {min_agreement:g} over {requests} "
            f"mirrored requests",
        )
    ]  # fmt: skip
    if max_latency_factor is not None:
        shadow_p95 = report.latency.p95_ms if report.latency else None
        if shadow_p95 is None or served_p95_ms is None:
            findings.append(
                Finding(criterion="latency", ok=None, pending=True, detail="not judged: no shadow or served p95 yet")
            )
        else:
            limit = max_latency_factor * served_p95_ms + latency_slack_ms
            fast = shadow_p95 <= limit
            findings.append(
                Finding(
                    criterion="latency", ok=fast,
                    detail=f"shadow p95 {shadow_p95:.3f} ms {'within' if fast else 'exceeds'} {max_latency_factor:g} × "
                    f"served p95 {served_p95_ms:.3f} ms = {limit:.3f} ms",
                )
            )  # fmt: skip
    return findings
