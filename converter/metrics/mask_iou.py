"""Mask IoU at a threshold: a heatmap (text detector, segmentation) thresholded as its post-processing does,
intersection over union of the candidate's mask with the FP32 mask over the whole evaluation set; and
`mask-iou-mae@T`, the lower of that IoU and 1 − the mean absolute error of the probabilities (the default rule
for probability maps, edgefleet.core.quality.task_defaults)."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import mask_iou, mask_iou_mae


def make(threshold: float) -> Metric:
    return Metric(
        f"mask-iou@{threshold:g}", mask_iou(threshold), f"IoU of the masks thresholded at {threshold:g}, against FP32"
    )


def make_with_mae(threshold: float) -> Metric:
    return Metric(
        f"mask-iou-mae@{threshold:g}",
        mask_iou_mae(threshold),
        f"the lower of the IoU of the masks thresholded at {threshold:g} and 1 − mean |p − p_FP32|, against FP32",
    )
