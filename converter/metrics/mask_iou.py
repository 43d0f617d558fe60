"""Masks at a threshold: a heatmap (text detector, segmentation, note onsets) thresholded as its post-processing
does, the candidate's mask against the FP32 mask over the whole evaluation set. `mask-iou@T`: intersection over
union; `mask-iou-mae@T`, the lower of that IoU and 1 − the mean absolute error of the probabilities (the default rule
for dense probability maps, edgefleet.core.quality.task_defaults). `mask-f1@T`: the F1 (Dice) of the positives, as
an event detector's user scores events; `mask-f1-mae@T`, the lower of that F1 and 1 − the mean absolute error (the
default rule for sparse maps)."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import mask_f1, mask_f1_mae, mask_iou, mask_iou_mae


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


def make_f1(threshold: float) -> Metric:
    return Metric(
        f"mask-f1@{threshold:g}", mask_f1(threshold), f"F1 of the masks' positives at {threshold:g}, against FP32"
    )


def make_f1_with_mae(threshold: float) -> Metric:
    return Metric(
        f"mask-f1-mae@{threshold:g}",
        mask_f1_mae(threshold),
        f"the lower of the F1 of the masks' positives at {threshold:g} and 1 − mean |p − p_FP32|, against FP32",
    )
