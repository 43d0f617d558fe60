"""Probability closeness: 1 − the mean absolute difference of the first output (probabilities) from FP32's, so
that higher stays better (1.0 = identical)."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import prob_closeness

PROB_MAE = Metric("prob-mae", prob_closeness, "1 − mean |p − p_FP32| of the first output")
