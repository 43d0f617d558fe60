"""Field accuracy: an application tells the agent the true label of an earlier request.

Every answered request gets a request id; the agent remembers the predicted class (argmax of the
first output) of the last `capacity` requests. A feedback call with the true label scores that
prediction. The share of correct predictions over the last `window` feedbacks is the model's field
accuracy, reported in telemetry and /metrics beside the golden-set agreement (which only says the
device computes what the build computed, not that the world still looks like the training data).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FieldScore:
    accuracy: float | None
    samples: int


class FeedbackError(Exception):
    """An unknown (or expired) request id, or a label that is not a class index."""


class FieldAccuracy:
    def __init__(self, capacity: int = 10_000, window: int = 500) -> None:
        self._lock = threading.Lock()
        self._predictions: OrderedDict[str, tuple[str, int | None]] = OrderedDict()  # id -> (model, class)
        self._outcomes: dict[str, deque[bool]] = {}
        self._capacity, self._window = capacity, window

    def remember(self, model: str, outputs: Mapping[str, np.ndarray]) -> str:
        """Record a prediction; returns the request id the caller quotes in its feedback."""
        first = next(iter(outputs.values()), None)
        predicted = int(np.argmax(first)) if first is not None and first.size > 1 else None
        request_id = uuid.uuid4().hex[:16]
        with self._lock:
            self._predictions[request_id] = (model, predicted)
            while len(self._predictions) > self._capacity:
                self._predictions.popitem(last=False)
        return request_id

    def feedback(self, model: str, request_id: str, label: int) -> bool:
        """Score a remembered prediction against the true label; True when it was right."""
        with self._lock:
            entry = self._predictions.pop(request_id, None)
            if entry is None or entry[0] != model:
                raise FeedbackError(
                    f"no recent request {request_id!r} for model {model!r} (kept: last {self._capacity})"
                )
            if entry[1] is None:
                raise FeedbackError(f"model {model!r} does not output class scores; field accuracy needs a classifier")
            correct = entry[1] == label
            self._outcomes.setdefault(model, deque(maxlen=self._window)).append(correct)
        return correct

    def score(self, model: str | None = None) -> FieldScore:
        """Field accuracy of one model, or of every model together."""
        with self._lock:
            outcomes = [o for m, d in self._outcomes.items() if model in (None, m) for o in d]
        if not outcomes:
            return FieldScore(None, 0)
        return FieldScore(sum(outcomes) / len(outcomes), len(outcomes))
