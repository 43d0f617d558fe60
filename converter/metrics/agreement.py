"""Per-sample class agreement: top-1 accuracy against labels when given, else argmax agreement with FP32.

A first output holding one integer per sample (skl2onnx's `output_label`) is compared as is; class scores
are reduced by argmax over everything but the sample axis (edgefleet/core/quality/task_metrics.py, shared with devices).
"""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import predicted, top1

__all__ = ["AGREEMENT", "TOP1", "predicted"]

TOP1 = Metric("top1", top1, "top-1 accuracy against the labels (argmax agreement with FP32 without labels)", True)
AGREEMENT = Metric("argmax-agreement", top1, "share of samples whose argmax matches the FP32 model's")
