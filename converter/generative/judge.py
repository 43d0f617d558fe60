"""Judging a candidate against FP32 on held-out text, teacher-forced: perplexity (its ratio to FP32's) and
next-token agreement, over the same windows of the evaluation text, each window one prefill from an empty cache.

The figures are edgefleet.core.quality.generation's, the ones the device computes on its golden text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgefleet.converter.generative.runtimes import GenerativeRunner
from edgefleet.core.quality.generation import negative_log_likelihood, next_tokens, perplexity

__all__ = ["Reference", "Scores", "reference_of", "score", "score_logits"]


@dataclass(frozen=True)
class Reference:
    """FP32 on the judged windows: its next token at each predicting position, and its perplexity."""

    windows: list[np.ndarray]
    next_tokens: list[np.ndarray]  # per window, len(window) - 1 tokens
    perplexity: float
    tokens: int


@dataclass(frozen=True)
class Scores:
    perplexity: float
    perplexity_ratio: float
    agreement: float
    tokens: int
    seconds: float


def reference_of(runner: GenerativeRunner, windows: list[np.ndarray]) -> Reference:
    logits = [runner.logits(w) for w in windows]
    total, count = 0.0, 0
    for lg, w in zip(logits, windows, strict=True):
        nll, n = negative_log_likelihood(lg, w)
        total, count = total + nll, count + n
    return Reference(
        windows=windows, next_tokens=[next_tokens(lg)[: len(w) - 1] for lg, w in zip(logits, windows, strict=True)],
        perplexity=perplexity(total, count), tokens=count,
    )  # fmt: skip


def score(runner: GenerativeRunner, reference: Reference) -> Scores:
    started = time.monotonic()
    logits = [runner.logits(w) for w in reference.windows]
    return score_logits(logits, reference, time.monotonic() - started)


def score_logits(logits: Sequence[np.ndarray], reference: Reference, seconds: float = 0.0) -> Scores:
    """The figures of per-window logits [len(window), vocab] against the reference (pure)."""
    total, count, agreed = 0.0, 0, 0
    for lg, window, want in zip(logits, reference.windows, reference.next_tokens, strict=True):
        nll, n = negative_log_likelihood(lg, window)
        total, count = total + nll, count + n
        agreed += int((next_tokens(lg)[: len(window) - 1] == want).sum())
    ppl = perplexity(total, count)
    return Scores(ppl, ppl / reference.perplexity, agreed / max(1, count), count, seconds)
