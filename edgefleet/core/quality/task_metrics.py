"""Task metrics as pure functions of (reference outputs, candidate outputs, labels) → score, higher is better.

One implementation for both sides: the converter's registry (edgefleet.converter.metrics) names them and the
device's golden check (edgefleet/core/quality/task_rule.py) re-computes the bundle's recorded metric with them.
Outputs are dicts of output name → values stacked over samples; the first output is the one judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from edgefleet.core.quality import detections
from edgefleet.core.quality.sqnr_slices import worst_sqnr

Outputs = Mapping[str, np.ndarray]
ScoreFn = Callable[[Outputs, Outputs, "np.ndarray | None"], float]


def first(outputs: Outputs) -> np.ndarray:
    return next(iter(outputs.values()))


def per_sample(values: np.ndarray) -> np.ndarray:
    """[samples, ...] → [samples, features]."""
    return values.reshape(len(values), -1)


def _text(values: np.ndarray) -> np.ndarray:
    return values.astype(str) if values.dtype.kind in "OS" else values


def predicted(values: np.ndarray) -> np.ndarray:
    """One class per sample: a label output (ids, or class names as strings) as it is, class scores by argmax."""
    flat = per_sample(values)
    if (np.issubdtype(values.dtype, np.integer) or values.dtype.kind in "OUS") and flat.shape[1] == 1:
        return _text(flat[:, 0])
    return flat.argmax(axis=1)


def top1(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    """Top-1 accuracy against the labels when given, else agreement with the reference's class."""
    got = predicted(first(candidate))
    want = _text(labels) if labels is not None else predicted(first(reference))
    return float(np.mean(got == want))


def top_k(k: int) -> ScoreFn:
    if k < 1:
        raise ValueError("top-k needs k >= 1")

    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        scores = per_sample(first(candidate))
        want = labels if labels is not None else predicted(first(reference))
        best = np.argsort(-scores, axis=1)[:, :k]
        return float(np.mean([w in row for w, row in zip(want, best, strict=True)]))

    return fn


def _classes(values: np.ndarray) -> np.ndarray:
    return _text(values) if values.dtype.kind in "iuOUSb" else values.argmax(axis=-1)


def per_position(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    """Share of positions (timesteps, tokens) whose argmax (or id) matches the reference's."""
    want, got = _classes(first(reference)), _classes(first(candidate))
    if want.shape != got.shape:
        return 0.0
    return float(np.mean(want == got)) if want.size else 1.0


def ctc_decode(classes: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding of one sequence of per-position classes: repeats merged, then the blank dropped."""
    text: list[int] = []
    previous = None
    for c in classes.tolist():
        if c != previous and c != blank:
            text.append(c)
        previous = c
    return text


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance (insertions, deletions and substitutions, each 1)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def sequences(values: np.ndarray) -> np.ndarray:
    """[samples, ...] → [samples, positions] classes: the argmax of scores over the last axis (ids as they are),
    every other axis but the first read as positions in order (a [T, 1, C] time-first head per sample included)."""
    classes = _classes(values)
    return classes.reshape(len(classes), -1)


def ctc_text(blank: int) -> ScoreFn:
    """A CTC head judged by what its user reads: each sample's positions decoded greedily (repeats merged, `blank`
    dropped), 1 − the character error rate of the candidate's text against the reference's over the whole set
    (total edit distance over the reference's total characters; 1.0 where neither reads a character)."""
    if blank < 0:
        raise ValueError("the blank class is a class index, >= 0")

    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        want, got = first(reference), first(candidate)
        if want.shape != got.shape:
            return 0.0
        errors = characters = 0
        for ref, cand in zip(sequences(want), sequences(got), strict=True):
            ref_text = ctc_decode(ref, blank)
            errors += edit_distance(ref_text, ctc_decode(cand, blank))
            characters += len(ref_text)
        if characters == 0:
            return 1.0 if errors == 0 else 0.0
        return max(0.0, 1.0 - errors / characters)

    return fn


def cosine(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    """Mean over samples of the cosine similarity of the first output with the reference's."""
    want, got = per_sample(first(reference)).astype(np.float64), per_sample(first(candidate)).astype(np.float64)
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
    dots = np.sum(want * got, axis=1)
    both_zero = norms == 0
    return float(np.mean(np.where(both_zero, 1.0, dots / np.where(both_zero, 1.0, norms))))


def prob_closeness(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    """1 − the mean absolute difference of the first output (probabilities) from the reference's."""
    diff = np.abs(first(candidate).astype(np.float64) - first(reference).astype(np.float64))
    return 1.0 - float(np.mean(diff)) if diff.size else 1.0


def mask_iou(threshold: float) -> ScoreFn:
    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        want, got = first(reference) > threshold, first(candidate) > threshold
        union = int(np.count_nonzero(want | got))
        return 1.0 if union == 0 else float(np.count_nonzero(want & got)) / union

    return fn


def _with_closeness(overlap: ScoreFn) -> ScoreFn:
    """A probability map judged on both what its post-processing keeps (`overlap` of the positives) and its
    values: the lower of the two, the values' as 1 − the mean absolute error."""

    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        return min(overlap(reference, candidate, labels), prob_closeness(reference, candidate, labels))

    return fn


def mask_iou_mae(threshold: float) -> ScoreFn:
    """A probability map (or one probability per sample): the lower of the IoU of the positives at `threshold` and
    1 − the mean absolute error."""
    return _with_closeness(mask_iou(threshold))


def mask_f1(threshold: float) -> ScoreFn:
    """The F1 (Dice) of the positives at `threshold` against the reference's, over the whole set: 2|A∩B| / (|A|+|B|),
    1.0 where neither has a positive. Monotone in the IoU (F1 = 2 IoU / (1 + IoU)); its bar reads as an event
    detector's F1."""

    def fn(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        want, got = first(reference) > threshold, first(candidate) > threshold
        total = int(np.count_nonzero(want)) + int(np.count_nonzero(got))
        return 1.0 if total == 0 else 2.0 * float(np.count_nonzero(want & got)) / total

    return fn


def mask_f1_mae(threshold: float) -> ScoreFn:
    """A sparse probability map (events, onsets, peaks: few positives): the lower of the F1 of the positives at
    `threshold` and 1 − the mean absolute error."""
    return _with_closeness(mask_f1(threshold))


def relative_error(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    """1 − Σ|candidate − reference| / Σ|reference| of the first output (a regression), floored at 0."""
    want, got = first(reference).astype(np.float64), first(candidate).astype(np.float64)
    if want.shape != got.shape or not np.all(np.isfinite(got)):
        return 0.0
    scale = float(np.sum(np.abs(want)))
    error = float(np.sum(np.abs(got - want)))
    if scale == 0.0:
        return 1.0 if error == 0.0 else 0.0
    return max(0.0, 1.0 - error / scale)


def sqnr(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    return worst_sqnr(candidate, reference)


def device_metric(name: str, reference: Outputs) -> ScoreFn | str:
    """The score function of a recorded metric name, or why a device cannot compute it (a user's file)."""
    fixed: dict[str, ScoreFn] = {
        "top1": top1, "argmax-agreement": top1, "per-position-agreement": per_position, "cosine": cosine,
        "sqnr-db": sqnr, "prob-mae": prob_closeness, "relative-error": relative_error,
    }  # fmt: skip
    if name in fixed:
        return fixed[name]
    if name == "detection-f1":
        layout = detections.recognize(reference)
        if layout is None:
            return "no known detection layout among the golden reference outputs"
        return lambda ref, cand, _labels: detections.f1(layout, ref, cand)
    try:
        if name.startswith("top") and name[3:].isdigit():
            return top_k(int(name[3:]))
        if name.startswith("mask-iou@"):
            return mask_iou(float(name[len("mask-iou@") :]))
        if name.startswith("mask-iou-mae@"):
            return mask_iou_mae(float(name[len("mask-iou-mae@") :]))
        if name.startswith("mask-f1-mae@"):
            return mask_f1_mae(float(name[len("mask-f1-mae@") :]))
        if name.startswith("mask-f1@"):
            return mask_f1(float(name[len("mask-f1@") :]))
        if name.startswith("ctc-char-accuracy@"):
            return ctc_text(int(name[len("ctc-char-accuracy@") :]))
    except ValueError as err:
        return f"the metric {name!r} is malformed: {err}"
    if ".py:" in name:
        return f"{name} is a user's metric: its code is not shipped to devices"
    return f"the metric {name!r} is unknown to this agent"
