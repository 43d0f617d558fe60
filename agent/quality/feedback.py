"""Field accuracy: an application tells the agent the true labels of an earlier request, on any path.

Every answered request (local HTTP API or MQTT request/response) is remembered under a request id with the
bundle that answered it and its predicted class per sample (argmax over the last axis of the first class-scores
output, or the labels an integer output holds). Feedback gives the true label of each sample (one integer, or
a list with one per sample); each sample counts once. The share of correct samples over the last `window`
feedback samples of a bundle is that bundle's field accuracy, reported in telemetry for the bundle it serves.

The same `remember` call hands the request's inputs and outputs to the quality observers (drift, shadow)
registered with `observe`: one call on every serving path feeds them all.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# (model name, bundle id, inputs, outputs) of an answered request
Observer = Callable[[str, str | None, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], None]


@dataclass(frozen=True)
class FieldScore:
    accuracy: float | None
    samples: int


class FeedbackError(Exception):
    """An unknown (or expired) request id, or labels that do not fit the prediction."""


def parse_labels(value: object) -> tuple[int, ...]:
    """One integer class index, or a list with one per sample; FeedbackError otherwise."""
    items = value if isinstance(value, list) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise FeedbackError(f"label must be an integer class index or a list of them, not {value!r}")
    return tuple(v for v in items if isinstance(v, int))


def predicted_classes(outputs: Mapping[str, np.ndarray], output: str | None = None) -> tuple[int, ...] | None:
    """Predicted class per sample: integer outputs as they are, class scores by argmax over the last axis."""
    value = outputs.get(output) if output else next(iter(outputs.values()), None)
    if value is None or value.size == 0 or value.dtype.kind in "OUS":  # class names: no class index to score
        return None
    if value.dtype.kind in "iu":  # integers (bool is not one)
        return tuple(value.reshape(-1).tolist())
    if value.ndim == 0 or value.shape[-1] < 2:
        return None
    return tuple(value.reshape(-1, value.shape[-1]).argmax(axis=1).tolist())


class FieldAccuracy:
    def __init__(self, capacity: int = 10_000, window: int = 500) -> None:
        self._lock = threading.Lock()
        # request id -> (model, bundle, predicted class per sample)
        self._predictions: OrderedDict[str, tuple[str, str | None, tuple[int, ...] | None]] = OrderedDict()
        self._outcomes: dict[tuple[str, str | None], deque[bool]] = {}
        self._capacity, self._window = capacity, window
        self._observers: list[Observer] = []
        self.class_output: Callable[[str], str | None] = lambda _model: None

    def observe(self, observer: Observer) -> None:
        """Call `observer` with every remembered request (inputs and outputs), on the caller's thread."""
        self._observers.append(observer)

    def remember(
        self,
        model: str,
        outputs: Mapping[str, np.ndarray],
        *,
        bundle_id: str | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
        request_id: str | None = None,
    ) -> str:
        """Record a prediction; returns the request id the caller quotes in its feedback."""
        predicted = predicted_classes(outputs, self.class_output(model))
        request_id = request_id or os.urandom(8).hex()  # 16 hex digits (this runs on every request)
        with self._lock:
            self._predictions[request_id] = (model, bundle_id, predicted)
            self._predictions.move_to_end(request_id)
            while len(self._predictions) > self._capacity:
                self._predictions.popitem(last=False)
        if inputs is not None:
            for observer in self._observers:
                observer(model, bundle_id, inputs, outputs)
        return request_id

    def feedback(self, model: str | None, request_id: str, label: int | Sequence[int]) -> bool:
        """Score a remembered prediction against the true labels; True when every sample was right."""
        labels = parse_labels(list(label) if isinstance(label, Sequence) else label)
        with self._lock:
            entry = self._predictions.get(request_id)
            if entry is None or model not in (None, entry[0]):
                raise FeedbackError(
                    f"no recent request {request_id!r} for model {model!r} (kept: last {self._capacity})"
                )
            name, bundle_id, predicted = entry
            if predicted is None:
                raise FeedbackError(f"model {name!r} does not output class scores; field accuracy needs a classifier")
            if len(labels) != len(predicted):
                raise FeedbackError(
                    f"request {request_id!r} answered {len(predicted)} sample(s), got {len(labels)} labels"
                )
            del self._predictions[request_id]
            outcomes = [p == t for p, t in zip(predicted, labels, strict=True)]
            self._outcomes.setdefault((name, bundle_id), deque(maxlen=self._window)).extend(outcomes)
        return all(outcomes)

    def score(self, model: str | None = None, bundle_id: str | None = None) -> FieldScore:
        """Field accuracy of one model (any bundle), of one bundle, or of everything together."""
        with self._lock:
            outcomes = [
                o for (m, b), d in self._outcomes.items() if model in (None, m) and bundle_id in (None, b) for o in d
            ]
        if not outcomes:
            return FieldScore(None, 0)
        return FieldScore(sum(outcomes) / len(outcomes), len(outcomes))
