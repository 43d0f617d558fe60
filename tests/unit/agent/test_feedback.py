"""Field accuracy: per sample, windowed, labelled by bundle; and the observers one remember call feeds."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.agent.quality.feedback import FeedbackError, FieldAccuracy, parse_labels


def _scores(classes: list[int], width: int = 10) -> np.ndarray:
    out = np.zeros((len(classes), width), np.float32)
    out[np.arange(len(classes)), classes] = 1.0
    return out


def test_each_sample_of_a_batch_counts_once() -> None:
    field = FieldAccuracy()
    request = field.remember("m", {"logits": _scores([3, 1, 4, 1])}, bundle_id="b1")
    # flattened across the batch, the argmax would be one class for four samples; per sample it is 3, 1, 4, 1
    assert field.feedback("m", request, [3, 1, 4, 2]) is False
    score = field.score("m")
    assert score.samples == 4 and score.accuracy == pytest.approx(0.75)


def test_accuracy_is_labelled_by_bundle_and_windowed() -> None:
    field = FieldAccuracy(window=4)
    for bundle, truth in (("old", 7), ("new", 2)):
        for _ in range(6):
            request = field.remember("m", {"logits": _scores([7])}, bundle_id=bundle)
            field.feedback("m", request, truth)
    assert field.score(bundle_id="old").accuracy == 1.0 and field.score(bundle_id="old").samples == 4
    assert field.score(bundle_id="new").accuracy == 0.0


def test_labels_must_fit_the_request() -> None:
    field = FieldAccuracy()
    request = field.remember("m", {"logits": _scores([1, 2])}, bundle_id="b")
    with pytest.raises(FeedbackError, match="answered 2 sample"):
        field.feedback("m", request, 1)
    with pytest.raises(FeedbackError, match="no recent request"):
        field.feedback("m", "unknown", 1)
    with pytest.raises(FeedbackError):
        parse_labels(True)
    with pytest.raises(FeedbackError):
        parse_labels(["1"])
    assert parse_labels([1, 2]) == (1, 2) and parse_labels(5) == (5,)


def test_integer_outputs_are_the_predicted_labels_and_single_values_are_not_classes() -> None:
    field = FieldAccuracy()
    labels = field.remember("m", {"label": np.array([4, 2], np.int64)}, bundle_id="b")
    assert field.feedback("m", labels, [4, 2]) is True
    regression = field.remember("r", {"y": np.array([[0.3]], np.float32)}, bundle_id="b")
    with pytest.raises(FeedbackError, match="does not output class scores"):
        field.feedback("r", regression, 0)


def test_a_remembered_request_reaches_the_observers_with_its_inputs() -> None:
    field = FieldAccuracy()
    seen: list[tuple[str, str | None]] = []
    field.observe(lambda model, bundle, inputs, outputs: seen.append((model, bundle)))
    field.remember("m", {"logits": _scores([1])}, bundle_id="b", inputs={"x": np.zeros(1)})
    field.remember("m", {"logits": _scores([1])}, bundle_id="b")  # no inputs: nothing to observe
    assert seen == [("m", "b")]
