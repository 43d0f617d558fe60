"""CTC text: a text recognizer's sequence head (CTC logits or probabilities, [.., T, C]; ids [.., T]) judged by the
text its user reads. Each sample's positions are decoded greedily (repeats merged, the blank class dropped) and the
candidate's text is compared with FP32's by edit distance: `ctc-char-accuracy@B` is 1 − the character error rate
against FP32, B the blank's class index (the default rule for a sequence head whose most frequent winner is class 0
or the last class, edgefleet.core.quality.task_defaults)."""

from __future__ import annotations

from edgefleet.converter.metrics.base import Metric
from edgefleet.core.quality.task_metrics import ctc_text


def make(blank: int) -> Metric:
    return Metric(
        f"ctc-char-accuracy@{blank}",
        ctc_text(blank),
        f"1 − the character error rate of the greedy CTC text (blank {blank}) against FP32's",
    )
