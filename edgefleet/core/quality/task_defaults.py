"""The task rule a model is judged by when its user names none, inferred from the judged output's shape, values and
name: one table, read by the converter (which chooses the recipe by it and records it, with why, in the manifest)
and by the device (whose golden check re-computes the recorded metric with edgefleet.core.quality.task_metrics).

By output kind (the first output that is not an input passed through):
- a recognized detection head with detections → `detection-f1`;
- labels or ids (integers, strings) → `top1` / `argmax-agreement` for one per sample, `per-position-agreement`
  for a sequence;
- a sequence of distributions (CTC, token heads: rows that sum to 1 or log-sum-exp to 0), token logits named
  so, or positions of scores with one clear winner at most positions and several different winners (a recognizer's
  raw logits, whatever its exporter named them): a CTC head, whose most frequent winner is class 0 or the last
  class and wins at least CTC_BLANK_SHARE of the positions (the blank), → `ctc-char-accuracy@B`, the greedy CTC
  text against FP32's (1 − the character error rate: a position flipping between the blank and a repeated
  character changes no text, and per-position agreement counted it); any other → `per-position-agreement`;
- a vector per sample: class scores (labels given, a distribution, a class-like name, or confident: most of its
  entry clearly above the rest in most samples) → `top1` / `argmax-agreement`; per-entry probabilities (sigmoid
  outputs, masks) → `mask-iou-mae@0.5`; an embedding (an embedding-like name, unit-norm rows, or any other
  feature vector) → `cosine`;
- a probability map or heatmap (values in [0, 1]) and one probability per sample → `mask-iou-mae@0.5`: the
  positives at the 0.5 threshold (IoU) and the probabilities themselves (1 − mean absolute error), the lower
  of the two; a sparse map (under SPARSE_SHARE of FP32's values are positives: onsets, notes, peaks, events)
  → `mask-f1-mae@0.5`, the positives' F1 in place of their IoU: such a map's user counts events by F1, and its
  few positives make the IoU swing with a handful of pixels at the threshold (basic-pitch's BF16 onsets: IoU
  0.9495, F1 0.974, note F1 0.975, bench/default_rules.py);
- anything else (a regression, a map of other values, hidden states) → `relative-error` (1 − Σ|Δ| / Σ|FP32|).

Each rule carries the drop below FP32 it allows by default (a mask is judged by 0.05 of IoU, a class by 0.01 of
accuracy): the converter uses the larger of it and the profile's budget unless the user gave a budget or a bar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.core.quality import detections

MAX_CLASSES = 100_000
WINNER_GAP = 2.0  # class logits: the top entry above the second by this many spreads of the others ...
CONFIDENT_SHARE = 0.6  # ... in at least this share of the samples
MIN_WINNER_WIDTH = 5  # fewer unnamed scores than this cannot show a winner: read as a regression
MIN_DISTINCT_WINNERS = 3  # sequence logits: positions of a sequence won by at least this many different classes
MASK_THRESHOLD = 0.5
SPARSE_SHARE = 0.05  # a map whose positives are under this share of its values is judged by their F1
CTC_BLANK_SHARE = 0.3  # a sequence head whose class 0 or last class wins this share of positions is CTC
MAX_CTC_POSITIONS = 1024  # longer sequences keep per-position agreement (the edit distance is quadratic)
EMBEDDING_NAME = re.compile(
    r"embed|emb\b|emb_|feature|feat\b|vector|pool|sentence|encod|hidden|latent|descriptor", re.I
)
CLASS_NAME = re.compile(r"logit|prob|score|class|cls|label|softmax|pred", re.I)
SEQUENCE_NAME = re.compile(r"ctc|logit|log_prob|token", re.I)
DEFAULT_DROP = {
    "top1": 0.01, "argmax-agreement": 0.01, "per-position-agreement": 0.01, "cosine": 0.01,
    "mask-iou-mae": 0.05, "mask-f1-mae": 0.05, "detection-f1": 0.05, "relative-error": 0.02,
    "ctc-char-accuracy": 0.01,
}  # fmt: skip


@dataclass(frozen=True)
class TaskRule:
    metric: str  # a metric name edgefleet.core.quality.task_metrics.device_metric computes
    output: str  # the output it judges
    kind: str  # detection, label, sequence, class-scores, probabilities, embedding, probability-map, regression
    why: str  # one sentence: what in the output chose it
    default_drop: float  # the drop below FP32 the rule allows when the user gives no budget

    def describe(self) -> str:
        return f"{self.metric} on {self.output!r} ({self.kind}): {self.why}"


def _rule(metric: str, output: str, kind: str, why: str) -> TaskRule:
    return TaskRule(metric, output, kind, why, DEFAULT_DROP[metric.split("@")[0]])


def _core(array: np.ndarray) -> list[int]:
    return [d for d in array.shape[1:] if d != 1]


def _distributions(rows: np.ndarray) -> bool:
    rows = rows.astype(np.float64)
    if rows.size == 0 or not np.all(np.isfinite(rows)):
        return False
    if rows.min() >= -1e-6 and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
        return True
    if rows.max() <= 1e-6:  # log-probabilities
        peak = rows.max(axis=1, keepdims=True)
        return bool(np.allclose(peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1)), 0.0, atol=1e-3))
    return False


def _in_unit_range(values: np.ndarray) -> bool:
    finite = values[np.isfinite(values)] if values.size else values
    return bool(finite.size) and float(finite.min()) >= -1e-6 and float(finite.max()) <= 1 + 1e-6


def _confident(rows: np.ndarray) -> bool:
    """A clear winner in most rows: the top entry above the second by WINNER_GAP spreads of the others (a scale-free
    test: a regression's large values make any softmax peaky, its entries are not one above the rest)."""
    rows = np.sort(rows.astype(np.float64), axis=1)
    rest = rows[:, :-1]
    spread = rest.std(axis=1)
    gap = rows[:, -1] - rows[:, -2]
    clear = gap > WINNER_GAP * np.where(spread > 0, spread, np.inf)
    return bool(np.mean(clear) >= CONFIDENT_SHARE)


def _varied(rows: np.ndarray) -> bool:
    """The winning entry is not the same everywhere: at least MIN_DISTINCT_WINNERS different ones (hidden states
    with an outlier dimension have one winner at every position; a recognizer's positions name several classes)."""
    return len(np.unique(np.argmax(rows, axis=1))) >= MIN_DISTINCT_WINNERS


def _sequence_logits(name: str, rows: np.ndarray) -> bool:
    """Rows of raw scores (not probabilities: a map in [0, 1] is judged as a map), not named as hidden states, with a
    clear winner at most positions and several different winners."""
    return (
        rows.shape[-1] >= MIN_WINNER_WIDTH and not EMBEDDING_NAME.search(name) and not _in_unit_range(rows)
        and _confident(rows) and _varied(rows)
    )  # fmt: skip


def _sequence(name: str, rows: np.ndarray, positions: int, why: str) -> TaskRule:
    """A sequence head's rule: CTC text where one class, 0 or the last, is a blank (it wins CTC_BLANK_SHARE of the
    positions or more), else per-position agreement. `rows`: [samples x positions, classes]; `positions`: per
    sample (a longer sequence keeps per-position agreement)."""
    winners = np.argmax(rows, axis=1)
    counts = np.bincount(winners, minlength=rows.shape[1])
    blank = int(np.argmax(counts))
    share = counts[blank] / max(1, len(winners))
    if blank in (0, rows.shape[1] - 1) and share >= CTC_BLANK_SHARE and positions <= MAX_CTC_POSITIONS:
        why += f"; class {blank} wins {share:.0%} of the positions, a CTC blank: the decoded text is judged"
        return _rule(f"ctc-char-accuracy@{blank}", name, "sequence", why)
    return _rule("per-position-agreement", name, "sequence", why)


def _positive_share(flat: np.ndarray) -> float | None:
    """The share of the finite values above MASK_THRESHOLD (None where none is finite)."""
    finite = flat[np.isfinite(flat)]
    return float(np.mean(finite > MASK_THRESHOLD)) if finite.size else None


def _unit_norm(rows: np.ndarray) -> bool:
    norms = np.linalg.norm(rows.astype(np.float64), axis=1)
    return bool(norms.size) and bool(np.allclose(norms, 1.0, atol=1e-3))


def infer(
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
    skip: Iterable[str] = (),
    class_labels: Iterable[str] = (),
) -> TaskRule:
    """The rule for a model whose FP32 outputs (stacked per sample) are `reference`; `skip`: outputs never judged
    (inputs passed through); `class_labels`: outputs whose columns are named classes (a ZipMap's)."""
    skipped = set(skip)
    names = [n for n in reference if n not in skipped] or list(reference)
    layout = detections.recognize({n: reference[n] for n in names})
    if layout is not None and any(len(d.scores) for d in detections.all_detections(layout, reference)):
        return _rule("detection-f1", layout.output, "detection", f"a {layout.describe()}")
    rule = _by_shape(names[0], reference[names[0]], labels, set(class_labels))
    if layout is not None:  # a head that detects nothing here cannot be judged by its detections
        why = f"a {layout.kind} detection head with no detection on the evaluation set, so {rule.why}"
        return TaskRule(rule.metric, rule.output, rule.kind, why, rule.default_drop)
    return rule


def _by_shape(name: str, ref: np.ndarray, labels: np.ndarray | None, class_labels: set[str]) -> TaskRule:
    dims = _core(ref)
    per_sample = int(np.prod(dims)) if dims else 1
    classes = "top1" if labels is not None else "argmax-agreement"
    mask = f"mask-iou-mae@{MASK_THRESHOLD:g}"
    if ref.dtype.kind in "biuOUS":
        if per_sample <= 1:
            return _rule(classes, name, "label", "one label or id per sample")
        return _rule("per-position-agreement", name, "sequence", "a label or id per position")
    if not np.issubdtype(ref.dtype, np.floating):
        return _rule("relative-error", name, "regression", f"{ref.dtype} values")
    flat = ref.reshape(len(ref), -1)
    if len(dims) == 2 and 2 <= dims[-1] <= MAX_CLASSES and ref.shape[-1] == dims[-1]:
        rows = ref.reshape(-1, ref.shape[-1])
        if _distributions(rows):
            why = f"{dims[0]} positions x {dims[1]} classes whose rows are distributions (CTC / token head)"
            return _sequence(name, rows, dims[0], why)
        if SEQUENCE_NAME.search(name) and not EMBEDDING_NAME.search(name):
            return _sequence(name, rows, dims[0], f"{dims[0]} positions x {dims[1]} scores, named {name!r}")
        if _sequence_logits(name, rows):
            why = (f"{dims[0]} positions x {dims[1]} scores with one clear winner at most positions, and the winners "
                   "vary (sequence logits: a CTC or token head)")  # fmt: skip
            return _sequence(name, rows, dims[0], why)
    if len(dims) == 1 and 2 <= dims[0] <= MAX_CLASSES:
        width = dims[0]
        if labels is not None:
            return _rule(classes, name, "class-scores", f"{width} scores per sample, with labels")
        if EMBEDDING_NAME.search(name):
            return _rule("cosine", name, "embedding", f"a {width}-d vector named {name!r}")
        if _distributions(flat):
            return _rule(classes, name, "class-scores", f"{width} class probabilities per sample (rows sum to 1)")
        if name in class_labels or CLASS_NAME.search(name):
            return _rule(classes, name, "class-scores", f"{width} scores per sample, named {name!r}")
        if _unit_norm(flat):
            return _rule("cosine", name, "embedding", f"a {width}-d vector of unit norm per sample")
        if _in_unit_range(flat):
            why = f"{width} values in [0, 1] per sample that are not one distribution (per-entry probabilities)"
            return _rule(mask, name, "probabilities", why)
        if width == 2:
            return _rule(classes, name, "class-scores", "two scores per sample (a binary classifier)")
        if width < MIN_WINNER_WIDTH:  # too few entries to tell a winner from chance: a small regression (box, pose)
            return _rule("relative-error", name, "regression", f"{width} values per sample (a regression)")
        if _confident(flat):
            why = f"{width} scores per sample with one clear winner in most samples (class logits)"
            return _rule(classes, name, "class-scores", why)
        return _rule("cosine", name, "embedding", f"a {width}-d feature vector per sample (no clear winning class)")
    if _in_unit_range(flat):
        if per_sample <= 1:
            return _rule(mask, name, "probability-map", "one probability per sample")
        what = f"a map of {per_sample} values in [0, 1]"
        share = _positive_share(flat)
        if share is not None and share < SPARSE_SHARE:
            what += f", {share:.1%} of them positives at {MASK_THRESHOLD:g} (sparse: judged by their F1)"
            return _rule(f"mask-f1-mae@{MASK_THRESHOLD:g}", name, "probability-map", what)
        return _rule(mask, name, "probability-map", what)
    if len(dims) == 2 and EMBEDDING_NAME.search(name):
        return _rule("cosine", name, "embedding", f"{dims[0]} x {dims[1]} hidden states named {name!r}")
    what = "one value per sample" if per_sample <= 1 else f"{per_sample} values per sample of shape {ref.shape[1:]}"
    return _rule("relative-error", name, "regression", f"{what} (a regression)")
