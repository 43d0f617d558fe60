"""Masks at a threshold: a heatmap (text detector, segmentation, note onsets) thresholded as its post-processing
does, the candidate's mask against the FP32 mask over the whole evaluation set. `mask-iou@T`: intersection over
union; `mask-iou-mae@T`, the lower of that IoU and 1 − the mean absolute error of the probabilities (the default rule
for dense probability maps, edgefleet.core.quality.task_defaults). `mask-f1@T`: the F1 (Dice) of the positives, as
an event detector's user scores events; `mask-f1-mae@T`, the lower of that F1 and 1 − the mean absolute error (the
default rule for sparse maps)."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import ScoreFn, mask_f1, mask_f1_mae, mask_iou, mask_iou_mae


def _metric(name: str, threshold: float, score: ScoreFn, what: str) -> Metric:
    return Metric(f"{name}@{threshold:g}", score, f"{what.format(t=f'{threshold:g}')}, against FP32")


def make(threshold: float) -> Metric:
    return _metric("mask-iou", threshold, mask_iou(threshold), "IoU of the masks thresholded at {t}")


def make_with_mae(threshold: float) -> Metric:
    what = "the lower of the IoU of the masks thresholded at {t} and 1 − mean |p − p_FP32|"
    return _metric("mask-iou-mae", threshold, mask_iou_mae(threshold), what)


def make_f1(threshold: float) -> Metric:
    return _metric("mask-f1", threshold, mask_f1(threshold), "F1 of the masks' positives at {t}")


def make_f1_with_mae(threshold: float) -> Metric:
    what = "the lower of the F1 of the masks' positives at {t} and 1 − mean |p − p_FP32|"
    return _metric("mask-f1-mae", threshold, mask_f1_mae(threshold), what)
