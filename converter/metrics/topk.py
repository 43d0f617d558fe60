"""Top-k: the label (or, without labels, the FP32 model's top-1 class) is among the candidate's k best."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import top_k


def make(k: int) -> Metric:
    return Metric(
        f"top{k}", top_k(k), f"the label (or FP32's top-1) is among the candidate's top {k}", uses_labels=True
    )
