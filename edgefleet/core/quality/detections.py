"""Detections compared, not tensors: common detection heads are recognized and judged by what they detect.

Layouts (per sample, after the batch axis):
- YOLO, attributes first `[4+classes, anchors]` (YOLOv8/v11 exports): cx, cy, w, h, then class scores;
- YOLO, anchors first `[anchors, 5+classes]` (YOLOv5, YOLOX): cx, cy, w, h, objectness, class scores;
- SSD-style two outputs: boxes `[anchors, 4]` (corners) and scores `[anchors, classes]` in [0, 1].
A table whose every row is a probability distribution is a recognizer's per-position softmax (a CTC head), not a
detection head, whatever its shape.
Detections are the boxes whose best score reaches CONFIDENCE, after per-class non-maximum suppression. A
candidate's detection matches an FP32 one with the same class, IoU >= MATCH_IOU and a score within
SCORE_DELTA; the score is the F1 of matched detections over the evaluation set (1.0 = the same detections).

Shared by the converter's `detection-f1` metric and the device's golden check (edgefleet/core/quality/task_rule.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

CONFIDENCE = 0.25
MATCH_IOU = 0.5
SCORE_DELTA = 0.1
NMS_IOU = 0.7
MAX_DETECTIONS = 100


@dataclass(frozen=True)
class Layout:
    kind: Literal["yolo-attributes-first", "yolo-anchors-first", "ssd"]
    output: str
    scores_output: str | None = None  # SSD: the scores tensor

    def describe(self) -> str:
        return f"{self.kind} ({self.output}{', ' + self.scores_output if self.scores_output else ''})"


def _rows(values: np.ndarray) -> np.ndarray | None:
    """[samples, (1,) a, b] → [samples, a, b], or None for another rank."""
    if values.ndim == 4 and values.shape[1] == 1:
        return values[:, 0]
    return values if values.ndim == 3 else None


def _per_position_distributions(rows: np.ndarray) -> bool:
    """Every row along the last axis a probability distribution: a recognizer's softmax over classes at each position
    (a CTC head [positions, classes]), never a detection table, whose rows mix box coordinates and scores."""
    return float(rows.min()) >= -1e-6 and bool(np.allclose(rows.sum(axis=-1, dtype=np.float64), 1.0, atol=1e-3))


def _in_unit(values: np.ndarray) -> bool:
    return bool(values.size) and float(values.min()) >= -1e-3 and float(values.max()) <= 1.0 + 1e-3


def recognize(reference: Mapping[str, np.ndarray]) -> Layout | None:
    floats = {n: v for n, v in reference.items() if np.issubdtype(v.dtype, np.floating)}
    for name, boxes in floats.items():
        rows = _rows(boxes)
        if rows is None or rows.shape[2] != 4:
            continue
        for other, scores in floats.items():
            srows = _rows(scores)
            if other != name and srows is not None and srows.shape[1] == rows.shape[1] and _in_unit(srows):
                return Layout("ssd", name, other)
    for name, values in floats.items():
        rows = _rows(values)
        if rows is None:
            continue
        a, b = rows.shape[1:]
        attrs, anchors = min(a, b), max(a, b)
        if attrs < 5 or anchors < 4 * attrs or _per_position_distributions(rows):
            continue
        kind: Literal["yolo-attributes-first", "yolo-anchors-first"] = (
            "yolo-attributes-first" if a < b else "yolo-anchors-first"
        )
        table = np.swapaxes(rows, 1, 2) if a < b else rows
        if _in_unit(table[..., 4:]) and float(table[..., 2:4].min()) >= 0.0:
            return Layout(kind, name)
    return None


def _table(layout: Layout, outputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Boxes as corners [samples, anchors, 4] and class scores [samples, anchors, classes]."""
    rows = _rows(outputs[layout.output])
    assert rows is not None
    if layout.kind == "ssd":
        assert layout.scores_output is not None
        scores = _rows(outputs[layout.scores_output])
        assert scores is not None
        return rows.astype(np.float64), scores.astype(np.float64)
    table = (np.swapaxes(rows, 1, 2) if layout.kind == "yolo-attributes-first" else rows).astype(np.float64)
    cx, cy, w, h = table[..., 0], table[..., 1], table[..., 2], table[..., 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    scores = table[..., 4:] if layout.kind == "yolo-attributes-first" else table[..., 5:] * table[..., 4:5]
    if scores.shape[-1] == 0:  # objectness only (one class)
        scores = table[..., 4:5]
    return boxes, scores


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1, y1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    x2, y2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


@dataclass(frozen=True)
class Detections:
    boxes: np.ndarray  # [n, 4] corners
    classes: np.ndarray  # [n]
    scores: np.ndarray  # [n]


def detect(boxes: np.ndarray, scores: np.ndarray) -> Detections:
    """One sample's detections: best class per anchor over CONFIDENCE, per-class NMS, at most MAX_DETECTIONS."""
    classes, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= CONFIDENCE)
    keep = keep[np.argsort(-best[keep], kind="stable")]
    chosen: list[int] = []
    for index in keep:
        same = [c for c in chosen if classes[c] == classes[index]]
        if same and float(iou(boxes[index], boxes[same]).max()) > NMS_IOU:
            continue
        chosen.append(int(index))
        if len(chosen) == MAX_DETECTIONS:
            break
    picked = np.array(chosen, dtype=np.int64)
    return Detections(boxes[picked].reshape(-1, 4), classes[picked], best[picked])


def matched(want: Detections, got: Detections) -> int:
    """Greedy one-to-one matching, FP32's most confident detections first."""
    free = np.ones(len(got.scores), dtype=bool)
    count = 0
    for i in range(len(want.scores)):
        ok = free & (got.classes == want.classes[i]) & (np.abs(got.scores - want.scores[i]) <= SCORE_DELTA)
        if not ok.any():
            continue
        overlaps = np.where(ok, iou(want.boxes[i], got.boxes), -1.0)
        j = int(overlaps.argmax())
        if overlaps[j] >= MATCH_IOU:
            free[j] = False
            count += 1
    return count


def all_detections(layout: Layout, outputs: Mapping[str, np.ndarray]) -> list[Detections]:
    boxes, scores = _table(layout, outputs)
    return [detect(boxes[i], scores[i]) for i in range(len(boxes))]


def f1(layout: Layout, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> float:
    """F1 of the candidate's detections matched to the reference's, over all samples (1.0 = the same)."""
    want, got = all_detections(layout, reference), all_detections(layout, candidate)
    hits = sum(matched(w, g) for w, g in zip(want, got, strict=True))
    total = sum(len(w.scores) + len(g.scores) for w, g in zip(want, got, strict=True))
    return 1.0 if total == 0 else 2.0 * hits / total


def describe(layout: Layout) -> str:
    return (
        f"F1 of detections matched to FP32's (same class, IoU >= {MATCH_IOU}, score within {SCORE_DELTA}; "
        f"{layout.describe()}, confidence {CONFIDENCE})"
    )
