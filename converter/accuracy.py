"""The accuracy gate: how close a transformed model stays to the FP32 source, judged against a budget.

The metric is the user's (`--metric`: a built-in task metric or `path.py:function`, converter.metrics) or,
by default, follows from the first output and the data:
- class scores (one vector per sample) with labels: top-1 accuracy; without labels: argmax agreement;
- a predicted label (one integer per sample, e.g. skl2onnx's `output_label`): label accuracy or agreement;
- a recognized detection head (YOLO-style, SSD boxes + scores) with detections on the evaluation set:
  detection F1 against FP32's detections;
- anything else: the lowest SQNR (dB) over every float output and over each output's channel groups of one
  scale (the worst slice decides), capped at SQNR_CAP_DB for bit-exact results.
The budget is a largest drop below the FP32 model's own score (`max_drop`), or an absolute bar (`min_score`);
for SQNR the floor is `min_sqnr_db`. Max-abs error and the worst slice's SQNR are reported for every candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edgefleet.converter.metrics import Metric, detection, resolve
from edgefleet.converter.metrics.sqnr import SQNR_CAP_DB, slice_report, sqnr_db

__all__ = ["SQNR_CAP_DB", "Budget", "MetricPlan", "Score", "gate", "plan_metric", "score", "sqnr_db"]

_MAX_CLASSES = 100_000


@dataclass(frozen=True)
class MetricPlan:
    """The metric for one model and evaluation set, decided once from the FP32 reference outputs."""

    name: str
    output: str
    kind: Literal["scores", "label", "signal", "detection", "task"]
    note: str = ""
    metric: Metric = field(default_factory=lambda: resolve("sqnr-db"))


def plan_metric(
    reference: Mapping[str, np.ndarray], labels: np.ndarray | None, requested: str | None = None
) -> MetricPlan:
    first = next(iter(reference))
    if requested:
        metric = resolve(requested, reference)
        kind: Literal["task", "detection"] = "detection" if metric.name == "detection-f1" else "task"
        return MetricPlan(metric.name, first, kind, metric.description, metric)
    ref = reference[first]
    per_sample = int(np.prod(ref.shape[1:])) if ref.ndim > 1 else 1
    squeezed = [d for d in ref.shape[1:] if d != 1]
    classes = "top1" if labels is not None else "argmax-agreement"
    if (np.issubdtype(ref.dtype, np.integer) or ref.dtype.kind in "OUS") and per_sample == 1:
        return MetricPlan(classes, first, "label", metric=resolve(classes))
    if np.issubdtype(ref.dtype, np.floating) and len(squeezed) == 1 and 1 < per_sample <= _MAX_CLASSES:
        return MetricPlan(classes, first, "scores", metric=resolve(classes))
    note = "labels ignored: the first output is not class scores" if labels is not None else ""
    layout = detection.recognize(reference)
    if layout is not None:
        found = sum(len(d.scores) for d in detection.all_detections(layout, reference))
        if found:
            metric = detection.make(layout)
            return MetricPlan(
                metric.name, layout.output, "detection", f"{layout.describe()}: {found} detections", metric
            )
        note = (note + "; " if note else "") + (
            f"a {layout.kind} detection head with no detection on the evaluation set: judged by SQNR"
        )
    return MetricPlan("sqnr-db", first, "signal", note, resolve("sqnr-db"))


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
