"""Task metrics, one file each, and the registry that names them.

A metric scores a candidate's outputs against the FP32 reference (and the labels when given); higher is better.
Built in: `top1`, `argmax-agreement`, `topK` (e.g. top5), `per-position-agreement`, `mask-iou@T` (e.g.
mask-iou@0.3), `mask-iou-mae@T` (the lower of that IoU and 1 − mean |Δp|), `mask-f1@T` and `mask-f1-mae@T` (the
same with the positives' F1), `ctc-char-accuracy@B` (greedy CTC text, blank class B, 1 − CER against FP32),
`cosine`, `sqnr-db` (worst slice), `prob-mae` (1 − mean |Δp|), `relative-error` (1 − Σ|Δ| / Σ|y|),
`detection-f1` (a recognized detection head).
A user metric is `path/to/file.py:function` (converter.metrics.user).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from edgefleet.converter.metrics import (
    agreement,
    cosine,
    ctc_text,
    detection,
    mae,
    mask_iou,
    per_position,
    relative_error,
    sqnr,
    topk,
    user,
)
from edgefleet.converter.metrics.base import Metric
from edgefleet.core.errors import UserInputError

__all__ = ["Metric", "names", "resolve"]

_FIXED: dict[str, Metric] = {
    m.name: m
    for m in (
        agreement.TOP1,
        agreement.AGREEMENT,
        per_position.PER_POSITION,
        cosine.COSINE,
        sqnr.SQNR,
        mae.PROB_MAE,
        relative_error.RELATIVE_ERROR,
    )
}
_PARAMETRIC: dict[str, tuple[str, Callable[[str], Metric]]] = {
    "top": ("topK, e.g. top5", lambda p: topk.make(int(p))),
    "mask-iou-mae@": ("mask-iou-mae@THRESHOLD, e.g. mask-iou-mae@0.5", lambda p: mask_iou.make_with_mae(float(p))),
    "mask-iou@": ("mask-iou@THRESHOLD, e.g. mask-iou@0.3", lambda p: mask_iou.make(float(p))),
    "mask-f1-mae@": ("mask-f1-mae@THRESHOLD, e.g. mask-f1-mae@0.5", lambda p: mask_iou.make_f1_with_mae(float(p))),
    "mask-f1@": ("mask-f1@THRESHOLD, e.g. mask-f1@0.5", lambda p: mask_iou.make_f1(float(p))),
    "ctc-char-accuracy@": ("ctc-char-accuracy@BLANK, e.g. ctc-char-accuracy@0", lambda p: ctc_text.make(int(p))),
}


def names() -> list[str]:
    return sorted(_FIXED) + [usage for usage, _ in _PARAMETRIC.values()] + ["detection-f1", "path.py:function"]


def resolve(spec: str, reference: Mapping[str, np.ndarray] | None = None) -> Metric:
    """The metric named by `spec`; `detection-f1` needs the reference outputs to recognize the head's layout."""
    if spec in _FIXED:
        return _FIXED[spec]
    if spec == "detection-f1":
        layout = detection.recognize(reference or {})
        if layout is None:
            raise UserInputError("--metric detection-f1: no known detection layout among the model's outputs")
        return detection.make(layout)
    if ".py:" in spec:
        return user.load(spec)
    for prefix, (_usage, factory) in _PARAMETRIC.items():
        if spec.startswith(prefix):
            try:
                return factory(spec[len(prefix) :])
            except ValueError as err:
                raise UserInputError(f"--metric {spec!r}: {err}") from err
    raise UserInputError(f"unknown metric {spec!r}; valid: {', '.join(names())}")
