"""With no metric from the user, a model is judged by the rule for its output's kind, and the device's golden check
computes the same metric by the same name (edgefleet.core.quality.task_defaults and task_metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.converter.metrics import resolve
from edgefleet.converter.search.gate import plan_metric
from edgefleet.core.quality.task_defaults import infer
from edgefleet.core.quality.task_metrics import device_metric

RNG = np.random.default_rng(7)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _winners(count: int, classes: int) -> np.ndarray:
    """Logits with one class well above the rest in every sample."""
    return RNG.normal(size=(count, classes)) + 8 * np.eye(classes)[RNG.integers(0, classes, count)]


def _ctc(samples: int, positions: int, classes: int, blank: int) -> np.ndarray:
    """CTC logits: the blank wins about 60 % of the positions, characters the rest."""
    winners = RNG.integers(0, classes, samples * positions)
    winners[RNG.uniform(size=winners.size) < 0.6] = blank
    logits = RNG.normal(size=(samples * positions, classes)) + 8 * np.eye(classes)[winners]
    return logits.reshape(samples, positions, classes)


def _sparse_map() -> np.ndarray:
    """Onsets: near 0 everywhere but at 1 % of the entries."""
    values = RNG.uniform(0, 0.2, size=(16, 1, 64, 88))
    peaks = RNG.uniform(size=values.shape) < 0.01
    return np.where(peaks, RNG.uniform(0.6, 1.0, size=values.shape), values)


KINDS = {
    "an embedding by name": ({"sentence_embedding": RNG.normal(size=(16, 384))}, "cosine", "embedding"),
    "an unnamed feature vector": ({"output": RNG.normal(size=(16, 1, 1, 96))}, "cosine", "embedding"),
    "unit-norm rows": ({"y": _unit(RNG.normal(size=(16, 64)))}, "cosine", "embedding"),
    "hidden states": ({"last_hidden_state": RNG.normal(size=(16, 12, 64))}, "cosine", "embedding"),
    "class probabilities": ({"out": _softmax(RNG.normal(size=(16, 10)) * 3)}, "argmax-agreement", "class-scores"),
    "confident logits": ({"out": _winners(16, 10)}, "argmax-agreement", "class-scores"),
    "logits by name": ({"logits": RNG.normal(size=(16, 10))}, "argmax-agreement", "class-scores"),
    "a token head, no class dominating": (
        {"softmax_0": _softmax(RNG.normal(size=(16, 40, 97)))},
        "per-position-agreement",
        "sequence",
    ),
    "a softmax sequence shaped like a YOLO table (40 positions x 6625 classes), no blank": (
        {"softmax_11.tmp_0": _softmax(_winners(16 * 40, 6625).reshape(16, 40, 6625))},
        "per-position-agreement",
        "sequence",
    ),
    "a CTC softmax, blank 0 (ppocr-rec: 40 positions x 6625 classes)": (
        {"softmax_11.tmp_0": _softmax(_ctc(16, 40, 6625, blank=0))},
        "ctc-char-accuracy@0",
        "sequence",
    ),
    "CTC logits, time first, named by the exporter, blank 0 (ddddocr)": (
        {"387": _ctc(16, 32, 97, blank=0).reshape(16, 32, 1, 97)},
        "ctc-char-accuracy@0",
        "sequence",
    ),
    "CTC logits named so, the last class the blank": (
        {"ctc_logits": _ctc(16, 24, 37, blank=36)},
        "ctc-char-accuracy@36",
        "sequence",
    ),
    "a sequence whose most frequent winner is a middle class (a pad token, not a CTC blank)": (
        {"token_logits": _ctc(16, 24, 37, blank=5)},
        "per-position-agreement",
        "sequence",
    ),
    "hidden states with one outlier dimension": (
        {"out": RNG.normal(size=(16, 12, 64)) + 40 * np.eye(64)[5]},
        "relative-error",
        "regression",
    ),
    "a probability map": ({"d0": RNG.uniform(size=(16, 1, 32, 32))}, "mask-iou-mae@0.5", "probability-map"),
    "a sparse map (onsets)": ({"onsets": _sparse_map()}, "mask-f1-mae@0.5", "probability-map"),
    "one probability per sample": ({"output": RNG.uniform(size=(16, 1))}, "mask-iou-mae@0.5", "probability-map"),
    "per-entry probabilities": ({"mask": RNG.uniform(size=(16, 1, 257))}, "mask-iou-mae@0.5", "probabilities"),
    "a map of other values": ({"depth": RNG.normal(size=(16, 1, 32, 32))}, "relative-error", "regression"),
    "a small regression": ({"y": RNG.normal(size=(16, 3)) * 50}, "relative-error", "regression"),
    "one label per sample": ({"label": RNG.integers(0, 3, (16, 1))}, "argmax-agreement", "label"),
}


@pytest.mark.parametrize("case", list(KINDS), ids=list(KINDS))
def test_the_default_rule_follows_the_outputs_kind_and_the_device_computes_it(case: str) -> None:
    reference, metric, kind = KINDS[case]
    reference = {k: np.asarray(v, dtype=np.float32 if np.asarray(v).dtype.kind == "f" else np.int64)
                 for k, v in reference.items()}  # fmt: skip
    rule = infer(reference)
    assert (rule.metric, rule.kind) == (metric, kind), rule.why
    assert rule.why and rule.default_drop > 0
    on_device = device_metric(rule.metric, reference)
    assert callable(on_device), on_device
    assert on_device(reference, reference, None) == pytest.approx(1.0)
    here = resolve(rule.metric)
    assert here(reference, reference, None) == pytest.approx(on_device(reference, reference, None))


def test_labels_make_a_vector_class_scores_and_judge_by_top1() -> None:
    reference = {"output": RNG.normal(size=(16, 96)).astype(np.float32)}
    assert infer(reference, labels=np.zeros(16, np.int64)).metric == "top1"


def test_an_input_passed_through_is_never_the_judged_output() -> None:
    reference = {"audio": RNG.normal(size=(16, 400)).astype(np.float32), "prob": RNG.uniform(size=(16, 1))}
    plan = plan_metric(reference, None, skip=["audio"])
    assert plan.output == "prob" and plan.skipped == ("audio",) and plan.name == "mask-iou-mae@0.5"


def test_the_mask_rule_is_the_lower_of_iou_at_the_threshold_and_one_minus_the_mean_error() -> None:
    want = {"m": np.array([[0.9, 0.8, 0.1, 0.2]], np.float32)}
    flipped = {"m": np.array([[0.9, 0.4, 0.1, 0.2]], np.float32)}  # one positive lost: IoU 0.5, MAE 0.1
    metric = resolve("mask-iou-mae@0.5")
    assert metric(want, flipped, None) == pytest.approx(0.5)
    shifted = {"m": want["m"] + 0.05}  # same decisions, 0.05 off everywhere: the MAE decides
    assert metric(want, shifted, None) == pytest.approx(0.95)


def test_relative_error_is_one_minus_the_l1_error_over_the_references_l1() -> None:
    want = {"y": np.array([[10.0, -10.0]], np.float32)}
    got = {"y": np.array([[11.0, -10.0]], np.float32)}
    assert resolve("relative-error")(want, got, None) == pytest.approx(0.95)
    assert resolve("relative-error")(want, {"y": np.full((1, 2), np.nan, np.float32)}, None) == 0.0


def test_a_sparse_map_is_judged_by_the_f1_of_its_positives_and_its_mean_error() -> None:
    want = {"m": np.array([[0.9, 0.8, 0.1, 0.2]], np.float32)}
    flipped = {"m": np.array([[0.9, 0.4, 0.1, 0.2]], np.float32)}  # one of two positives lost: F1 2/3, IoU 1/2
    assert resolve("mask-f1-mae@0.5")(want, flipped, None) == pytest.approx(2 / 3)
    assert resolve("mask-f1@0.5")(want, flipped, None) == pytest.approx(2 / 3)
    assert resolve("mask-iou-mae@0.5")(want, flipped, None) == pytest.approx(0.5)
    shifted = {"m": want["m"] + 0.05}  # same decisions: the MAE decides
    assert resolve("mask-f1-mae@0.5")(want, shifted, None) == pytest.approx(0.95)
    nothing = {"m": np.zeros((1, 4), np.float32)}
    assert resolve("mask-f1@0.5")(nothing, nothing, None) == 1.0


def _one_hot_positions(classes_per_position: list[list[int]], classes: int = 6) -> dict[str, np.ndarray]:
    return {"ctc": np.eye(classes, dtype=np.float32)[np.array(classes_per_position)]}


def test_ctc_text_is_the_greedy_decoding_judged_by_its_character_error_rate() -> None:
    metric = resolve("ctc-char-accuracy@0")
    # "ab" and "cd": positions a a _ b and c _ d _ (0 the blank)
    want = _one_hot_positions([[1, 1, 0, 2], [3, 0, 4, 0]])
    same_text = _one_hot_positions([[1, 0, 0, 2], [3, 3, 4, 4]])  # other positions, the same text: no error
    assert metric(want, same_text, None) == 1.0
    assert resolve("per-position-agreement")(want, same_text, None) == pytest.approx(5 / 8)  # 3 positions differ
    one_wrong = _one_hot_positions([[1, 1, 0, 5], [3, 0, 4, 0]])  # "ae" for "ab": 1 error in 4 characters
    assert metric(want, one_wrong, None) == pytest.approx(0.75)
    split = _one_hot_positions([[1, 0, 1, 2], [3, 0, 4, 0]])  # "aab": a blank splits a repeat, 1 insertion
    assert metric(want, split, None) == pytest.approx(0.75)
    empty = _one_hot_positions([[0, 0, 0, 0], [0, 0, 0, 0]])
    assert metric(want, empty, None) == 0.0  # every character lost
    assert metric(empty, empty, None) == 1.0
    assert metric(want, {"ctc": want["ctc"][:, :3]}, None) == 0.0  # a different shape scores nothing
    assert device_metric("ctc-char-accuracy@0", want)(want, one_wrong, None) == pytest.approx(0.75)  # type: ignore[operator]


@pytest.mark.parametrize("name", ["ctc-char-accuracy@-1", "ctc-char-accuracy@x", "mask-f1-mae@high"])
def test_a_malformed_metric_name_is_refused_on_both_sides(name: str) -> None:
    from edgefleet.core.errors import UserInputError

    with pytest.raises(UserInputError):
        resolve(name)
    reason = device_metric(name, {})
    assert isinstance(reason, str) and "malformed" in reason
