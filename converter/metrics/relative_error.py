"""Relative error of a regression: 1 − Σ|y − y_FP32| / Σ|y_FP32| of the first output, so that higher stays better
(1.0 = identical); the default rule for outputs that are neither classes, probabilities nor embeddings."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import relative_error

RELATIVE_ERROR = Metric("relative-error", relative_error, "1 − Σ|y − y_FP32| / Σ|y_FP32| of the first output")
