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


KINDS = {
    "an embedding by name": ({"sentence_embedding": RNG.normal(size=(16, 384))}, "cosine", "embedding"),
    "an unnamed feature vector": ({"output": RNG.normal(size=(16, 1, 1, 96))}, "cosine", "embedding"),
    "unit-norm rows": ({"y": _unit(RNG.normal(size=(16, 64)))}, "cosine", "embedding"),
    "hidden states": ({"last_hidden_state": RNG.normal(size=(16, 12, 64))}, "cosine", "embedding"),
    "class probabilities": ({"out": _softmax(RNG.normal(size=(16, 10)) * 3)}, "argmax-agreement", "class-scores"),
    "confident logits": ({"out": _winners(16, 10)}, "argmax-agreement", "class-scores"),
    "logits by name": ({"logits": RNG.normal(size=(16, 10))}, "argmax-agreement", "class-scores"),
    "a CTC head": ({"softmax_0": _softmax(RNG.normal(size=(16, 40, 97)))}, "per-position-agreement", "sequence"),
    "a CTC softmax shaped like a YOLO table (ppocr-rec: 40 positions x 6625 classes)": (
        {"softmax_11.tmp_0": _softmax(_winners(16 * 40, 6625).reshape(16, 40, 6625))},
        "per-position-agreement",
        "sequence",
    ),
    "CTC logits, time first, named by the exporter": (
        {"387": _winners(16 * 32, 97).reshape(16, 32, 1, 97)},
        "per-position-agreement",
        "sequence",
    ),
    "hidden states with one outlier dimension": (
        {"out": RNG.normal(size=(16, 12, 64)) + 40 * np.eye(64)[5]},
        "relative-error",
        "regression",
    ),
    "a probability map": ({"d0": RNG.uniform(size=(16, 1, 32, 32))}, "mask-iou-mae@0.5", "probability-map"),
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
