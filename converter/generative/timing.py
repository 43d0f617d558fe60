"""Timing generation at batch 1, interleaved: each round runs every candidate in turn (the order rotated each
round), one untimed generation then `runs` timed ones, each block after the previous one's threads went quiet
(ONNX Runtime's workers spin after a run, and two of its sessions fight for 2 cores as much as two runtimes do).
A noisy neighbour then slows every candidate alike; the figures are medians over all rounds. 7 rounds of 5: on
tinylm, two runs of 5 x 3 differed by up to 1.9x on an ONNX Runtime candidate's TPOT, two of 7 x 5 by up to 30 %.

TTFT: from the call to the first token for a `prompt_tokens` prompt; TPOT: the mean time between the output
tokens after it, per generation of `output_tokens`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.converter.generative.runtimes import GenerativeRunner, TimedGeneration
from edgefleet.converter.timing.latency import settle

__all__ = ["ROUNDS", "RUNS_PER_ROUND", "TokenTimes", "interleaved", "summarize"]

ROUNDS = 7
RUNS_PER_ROUND = 5


@dataclass(frozen=True)
class TokenTimes:
    ttft_ms: float  # median
    tpot_ms: float  # median over generations of each one's mean time per output token
    tpot_p90_ms: float
    ttft_p90_ms: float
    runs: int


def summarize(runs: list[TimedGeneration]) -> TokenTimes:
    ttft = [r.ttft_ms for r in runs]
    tpot = [r.tpot_ms for r in runs]
    return TokenTimes(
        ttft_ms=statistics.median(ttft), tpot_ms=statistics.median(tpot),
        tpot_p90_ms=float(np.percentile(tpot, 90)), ttft_p90_ms=float(np.percentile(ttft, 90)), runs=len(runs),
    )  # fmt: skip


def interleaved(
    runners: Mapping[str, GenerativeRunner],
    prompt: np.ndarray,
    output_tokens: int,
    *,
    rounds: int = ROUNDS,
    runs: int = RUNS_PER_ROUND,
    on_round: Callable[[int, int], None] | None = None,
) -> dict[str, TokenTimes]:
    names = list(runners)
    times: dict[str, list[TimedGeneration]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            settle()
            runner = runners[name]
            runner.timed(prompt, output_tokens)  # untimed: caches and this runtime's threads warm again
            times[name] += [runner.timed(prompt, output_tokens) for _ in range(runs)]
        if on_round is not None:
            on_round(index + 1, rounds)
    return {name: summarize(values) for name, values in times.items()}
