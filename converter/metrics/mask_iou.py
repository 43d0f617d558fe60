"""Mask IoU at a threshold: a heatmap (text detector, segmentation) thresholded as its post-processing does,
intersection over union of the candidate's mask with the FP32 mask over the whole evaluation set."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.task_metrics import mask_iou


def make(threshold: float) -> Metric:
    return Metric(
        f"mask-iou@{threshold:g}", mask_iou(threshold), f"IoU of the masks thresholded at {threshold:g}, against FP32"
    )
