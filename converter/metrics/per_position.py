"""Per-position argmax agreement: sequence outputs (CTC logits [.., T, C], token ids [.., T]) compared at every
position, e.g. every timestep of a text recognizer. Integer outputs are compared as they are."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import per_position

PER_POSITION = Metric("per-position-agreement", per_position, "share of positions whose argmax matches FP32's")
