"""What a task metric is: a score of a candidate's outputs against the FP32 reference outputs; higher is better."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.core.quality.task_metrics import first, per_sample

__all__ = ["Metric", "MetricFn", "Outputs", "first", "per_sample"]

Outputs = Mapping[str, np.ndarray]  # output name → per-sample outputs stacked on axis 0
MetricFn = Callable[[Outputs, Outputs, "np.ndarray | None"], float]


@dataclass(frozen=True)
class Metric:
    """A named score; `fn(reference_outputs, candidate_outputs, labels)`; higher is better."""

    name: str
    fn: MetricFn
    description: str
    uses_labels: bool = False  # the score is against labels when given (the FP32 model gets a score too)

    def __call__(self, reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        return float(self.fn(reference, candidate, labels))
