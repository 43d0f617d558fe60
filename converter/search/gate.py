"""The accuracy gate: how close a transformed model stays to the FP32 source, judged against a budget.

The metric is the user's (`--metric`: a built-in task metric or `path.py:function`, converter.metrics), SQNR
when the user gave only an SQNR floor (`--min-sqnr`), or, by default, the task rule for the judged output's kind
(edgefleet.core.quality.task_defaults, the table the device's golden check shares): detection F1 for a recognized
detection head, argmax / top-1 for class scores and labels, per-position agreement for CTC and token sequences,
cosine for embeddings, mask IoU plus mean absolute error for probability maps, relative error for regressions.
The plan says which it chose and why; outputs that only pass an input through are never judged.
The budget is a largest drop below the FP32 model's own score (`max_drop`), or an absolute bar (`min_score`);
for SQNR the floor is `min_sqnr_db`. Max-abs error and the worst slice's SQNR are reported for every candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edgefleet.converter.metrics import Metric, detection, resolve
from edgefleet.converter.metrics.sqnr import SQNR_CAP_DB, slice_report, sqnr_db
from edgefleet.core.quality import task_defaults

__all__ = ["SQNR_CAP_DB", "Budget", "MetricPlan", "Score", "gate", "plan_metric", "score", "sqnr_db"]


PlanKind = Literal["scores", "label", "signal", "detection", "task"]


@dataclass(frozen=True)
class MetricPlan:
    """The metric for one model and evaluation set, decided once from the FP32 reference outputs."""

    name: str
    output: str  # the output it judges
    kind: PlanKind
    note: str = ""
    metric: Metric = field(default_factory=lambda: resolve("sqnr-db"))
    why: str = ""  # the default rule chosen: what in the output chose it (empty when the user named the metric)
    default_drop: float | None = None  # the default rule's drop below FP32 (None: the profile's or the user's)
    skipped: tuple[str, ...] = ()  # outputs never judged (inputs passed through)

    @property
    def description(self) -> str:
        """The metric's description, and why it was chosen where the user named none (the manifest's record)."""
        return self.metric.description + (f"; chosen by default: {self.why}" if self.why else "")


def plan_metric(
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray | None,
    requested: str | None = None,
    *,
    skip: Iterable[str] = (),
    class_labels: Iterable[str] = (),
    sqnr: bool = False,
) -> MetricPlan:
    """`requested`: the user's metric; `sqnr`: the user gave an SQNR floor and no metric; `skip`: outputs never
    judged; `class_labels`: outputs whose columns are named classes."""
    skipped = tuple(n for n in skip if n in reference and len(reference) > 1)
    first = next(n for n in reference if n not in skipped)
    if requested:
        metric = resolve(requested, reference)
        asked: PlanKind = "detection" if metric.name == "detection-f1" else "task"
        return MetricPlan(metric.name, first, asked, metric.description, metric, skipped=skipped)
    if sqnr:
        return MetricPlan("sqnr-db", first, "signal", "judged by SQNR: --min-sqnr without --metric",
                          resolve("sqnr-db"), skipped=skipped)  # fmt: skip
    rule = task_defaults.infer(reference, labels, skipped, class_labels)
    note = f"chosen by default for {rule.output!r} ({rule.kind}): {rule.why}"
    if labels is not None and rule.kind not in ("class-scores", "label"):
        note += "; labels ignored: the judged output is not class scores"
    kinds: dict[str, PlanKind] = {"detection": "detection", "label": "label", "class-scores": "scores"}
    layout = detection.recognize(reference) if rule.metric == "detection-f1" else None
    metric = detection.make(layout) if layout is not None else resolve(rule.metric)
    return MetricPlan(
        rule.metric, rule.output, kinds.get(rule.kind, "task"), note, metric, rule.why, rule.default_drop, skipped
    )


@dataclass(frozen=True)
class Score:
    metric: str
    value: float
    sqnr_db: float  # lowest over float outputs and their slices, capped
    max_abs: float  # largest over all outputs
    worst_slice: str = ""  # where the lowest SQNR is

    def as_dict(self) -> dict[str, float | str]:
        return {
            "metric": self.metric,
            "value": self.value,
            "sqnr_db": self.sqnr_db,
            "max_abs": self.max_abs,
            "worst_slice": self.worst_slice,
        }


def _failed(plan: MetricPlan) -> Score:
    return Score(plan.name, 0.0 if plan.name != "sqnr-db" else -SQNR_CAP_DB, -SQNR_CAP_DB, float("inf"))


def score(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray | None,
    plan: MetricPlan,
) -> Score:
    """Score `outputs` (stacked per sample) against the FP32 `reference` under `plan`."""
    max_abs = 0.0
    for name, want in reference.items():
        got = outputs.get(name)
        if got is None or got.shape != want.shape:
            return _failed(plan)
        if want.dtype.kind in "OUSb":  # labels as strings or booleans: equal or not
            max_abs = max(max_abs, 0.0 if np.array_equal(got, want) else float("inf"))
            continue
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        if diff.size and not np.all(np.isfinite(diff)):
            return _failed(plan)
        max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
    judged = [plan.output] + [n for n in reference if n != plan.output and n not in plan.skipped]
    reference = {n: reference[n] for n in judged}  # the judged output first: the metric reads the first
    outputs = {n: outputs[n] for n in judged}
    slices = slice_report(outputs, reference)
    worst = slices[0].sqnr_db if slices else SQNR_CAP_DB
    where = slices[0].describe() if slices and worst < SQNR_CAP_DB else ""
    value = worst if plan.name == "sqnr-db" else plan.metric(reference, outputs, labels)
    return Score(plan.name, value, worst, max_abs, where)


@dataclass(frozen=True)
class Budget:
    max_drop: float
    min_sqnr_db: float
    min_score: float | None = None  # an absolute bar on the metric, instead of a drop below FP32

    def floor(self, metric: str, reference: float) -> float:
        if self.min_score is not None:
            return self.min_score
        return self.min_sqnr_db if metric == "sqnr-db" else reference - self.max_drop

    def allowed_drop(self, metric: str, reference: float) -> float:
        """The budget in the manifest's terms: how far below `reference` a value may fall."""
        return reference - self.floor(metric, reference)


def gate(candidate: Score, reference: float, budget: Budget) -> str | None:
    """None when the candidate is inside the budget, else the reason it is not."""
    floor = budget.floor(candidate.metric, reference)
    if candidate.value >= floor - 1e-12:
        return None
    if candidate.metric == "sqnr-db":
        where = f" at {candidate.worst_slice}" if candidate.worst_slice else ""
        return (
            f"SQNR {candidate.value:.1f} dB{where} below the budget floor {floor:.1f} dB "
            f"(max |error| {candidate.max_abs:.3g})"
        )
    if budget.min_score is not None:
        return f"{candidate.metric} {candidate.value:.4f} below the bar {floor:.4f} (--min-score)"
    return (
        f"{candidate.metric} {candidate.value:.4f} below the budget floor {floor:.4f} "
        f"(FP32 reference {reference:.4f} minus {budget.max_drop:.4f})"
    )
