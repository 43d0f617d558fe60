"""Interleaved TTFT/TPOT: every candidate in every round, the order rotated, an untimed run first; medians."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.converter.generative.runtimes import TimedGeneration
from edgefleet.converter.generative.timing import interleaved, summarize


class _Fake:
    def __init__(self, name: str, tpot: float, log: list[str]) -> None:
        self.name, self.tpot, self.log = name, tpot, log

    def logits(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        raise NotImplementedError

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        self.log.append(self.name)
        return TimedGeneration(len(ids) * self.tpot, self.tpot, new_tokens)

    def close(self) -> None:
        pass


def test_rounds_rotate_and_each_block_starts_untimed() -> None:
    log: list[str] = []
    runners = {"a": _Fake("a", 0.1, log), "b": _Fake("b", 0.2, log)}
    times = interleaved(runners, np.arange(8), 4, rounds=2, runs=2)
    assert log == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    assert times["a"].tpot_ms == pytest.approx(0.1) and times["a"].ttft_ms == pytest.approx(0.8)
    assert times["b"].runs == 4


def test_summary_is_median_and_p90() -> None:
    runs = [TimedGeneration(t, t / 10, 32) for t in (1.0, 2.0, 3.0, 4.0, 100.0)]
    summary = summarize(runs)
    assert (summary.ttft_ms, summary.tpot_ms) == (3.0, pytest.approx(0.3))
    assert summary.tpot_p90_ms == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4, 10.0], 90))
