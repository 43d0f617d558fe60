"""The accuracy gate: how close a transformed model stays to the FP32 source, judged against a budget.

Which metric applies follows from the first output and the data:
- class scores (one vector per sample) with labels: top-1 accuracy; without labels: argmax agreement;
- a predicted label (one integer per sample, e.g. skl2onnx's `output_label`): label accuracy or agreement;
- anything else (probabilities of one value, recurrent state, embeddings): the lowest SQNR (dB) over every
  float output against the FP32 reference, capped at SQNR_CAP_DB for bit-exact results.
Max-abs error and SQNR are reported for every candidate whatever the metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

MetricName = Literal["top1", "argmax-agreement", "sqnr-db"]
SQNR_CAP_DB = 120.0
_MAX_CLASSES = 100_000


@dataclass(frozen=True)
class MetricPlan:
    """The metric for one model and evaluation set, decided once from the FP32 reference outputs."""

    name: MetricName
    output: str
    kind: Literal["scores", "label", "signal"]
    note: str = ""


def plan_metric(reference: Mapping[str, np.ndarray], labels: np.ndarray | None) -> MetricPlan:
    first = next(iter(reference))
    ref = reference[first]
    per_sample = int(np.prod(ref.shape[1:])) if ref.ndim > 1 else 1
    squeezed = [d for d in ref.shape[1:] if d != 1]
    if np.issubdtype(ref.dtype, np.integer) and per_sample == 1:
        return MetricPlan("top1" if labels is not None else "argmax-agreement", first, "label")
    if np.issubdtype(ref.dtype, np.floating) and len(squeezed) == 1 and 1 < per_sample <= _MAX_CLASSES:
        return MetricPlan("top1" if labels is not None else "argmax-agreement", first, "scores")
    note = "labels ignored: the first output is not class scores" if labels is not None else ""
    return MetricPlan("sqnr-db", first, "signal", note)


@dataclass(frozen=True)
class Score:
    metric: MetricName
    value: float
    sqnr_db: float  # lowest over float outputs, capped
    max_abs: float  # largest over all outputs

    def as_dict(self) -> dict[str, float | str]:
        return {"metric": self.metric, "value": self.value, "sqnr_db": self.sqnr_db, "max_abs": self.max_abs}


def sqnr_db(got: np.ndarray, want: np.ndarray) -> float:
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    noise = float(np.sum((want64 - got64) ** 2))
    signal = float(np.sum(want64**2))
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return 0.0
    return float(min(SQNR_CAP_DB, 10.0 * np.log10(signal / noise)))


def _predicted(values: np.ndarray, kind: str) -> np.ndarray:
    if kind == "label":
        return values.reshape(len(values))
    return values.reshape(len(values), -1).argmax(axis=1)


def score(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray | None,
    plan: MetricPlan,
) -> Score:
    """Score `outputs` (stacked per sample) against the FP32 `reference` under `plan`."""
    sqnrs, max_abs = [], 0.0
    for name, want in reference.items():
        got = outputs.get(name)
        if got is None or got.shape != want.shape:
            return Score(plan.name, 0.0 if plan.name != "sqnr-db" else -SQNR_CAP_DB, -SQNR_CAP_DB, float("inf"))
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
        if np.issubdtype(want.dtype, np.floating):
            sqnrs.append(sqnr_db(got, want))
    worst = min(sqnrs) if sqnrs else SQNR_CAP_DB
    if plan.name == "sqnr-db":
        return Score(plan.name, worst, worst, max_abs)
    got_pred = _predicted(outputs[plan.output], plan.kind)
    if labels is not None:
        value = float(np.mean(got_pred == labels))
    else:
        value = float(np.mean(got_pred == _predicted(reference[plan.output], plan.kind)))
    return Score(plan.name, value, worst, max_abs)


@dataclass(frozen=True)
class Budget:
    max_drop: float
    min_sqnr_db: float

    def floor(self, metric: MetricName, reference: float) -> float:
        return self.min_sqnr_db if metric == "sqnr-db" else reference - self.max_drop

    def allowed_drop(self, metric: MetricName, reference: float) -> float:
        """The budget in the manifest's terms: how far below `reference` a value may fall."""
        return reference - self.floor(metric, reference)


def gate(candidate: Score, reference: float, budget: Budget) -> str | None:
    """None when the candidate is inside the budget, else the reason it is not."""
    floor = budget.floor(candidate.metric, reference)
    if candidate.value >= floor - 1e-12:
        return None
    if candidate.metric == "sqnr-db":
        return (
            f"SQNR {candidate.value:.1f} dB below the budget floor {floor:.1f} dB (max |error| {candidate.max_abs:.3g})"
        )
    return (
        f"accuracy {candidate.value:.4f} below the budget floor {floor:.4f} "
        f"(FP32 reference {reference:.4f} minus {budget.max_drop:.4f})"
    )
