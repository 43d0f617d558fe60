"""Cosine similarity of each sample's first output with FP32's (embeddings), averaged over samples."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import cosine

COSINE = Metric("cosine", cosine, "mean cosine similarity of each sample's output with FP32's")
