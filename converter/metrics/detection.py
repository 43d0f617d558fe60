"""Detections compared, not tensors: the `detection-f1` metric over a recognized detection head.

The layouts, the detections and their matching live in edgefleet/core/quality/detections.py, shared with the device's
golden check, so that the converter and the device judge a detector by the same rule.
"""

from __future__ import annotations

import numpy as np

from edgefleet.converter.metrics.base import Metric, Outputs
from edgefleet.core.quality.detections import (
    CONFIDENCE,
    MATCH_IOU,
    MAX_DETECTIONS,
    NMS_IOU,
    SCORE_DELTA,
    Detections,
    Layout,
    all_detections,
    describe,
    detect,
    f1,
    iou,
    matched,
    recognize,
)

__all__ = [
    "CONFIDENCE", "MATCH_IOU", "MAX_DETECTIONS", "NMS_IOU", "SCORE_DELTA", "Detections", "Layout",
    "all_detections", "detect", "iou", "make", "matched", "recognize",
]  # fmt: skip


def make(layout: Layout) -> Metric:
    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        return f1(layout, reference, candidate)

    return Metric("detection-f1", fn, describe(layout))
