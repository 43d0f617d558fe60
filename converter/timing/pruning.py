"""Early pruning of candidates that cannot win: a pure rule over latency evidence, and the runner wrapper that
applies it while a candidate's accuracy is evaluated.

Only a candidate that passed its accuracy gate (and fits the size limit) becomes a bound, and a candidate is
dropped only when even its *fastest* run is slower than `margin` times a bound's *median*: the fastest
eligible candidate is therefore never dropped (its fastest run is at most its median, which is at most any
other eligible candidate's median). A dropped candidate keeps no accuracy score, so it can never ship.

The evidence comes for free: the per-sample times of the accuracy evaluation (at the timing's thread count)
and, in the timing phase, the interleaved rounds. Evaluation times come from different moments, so a verdict
drawn from them is confirmed head to head (the best candidate and the suspect alternating) before anything
is dropped (each block after the other runtime's threads went quiet: converter.timing.latency.settle). Retries of a
quantized recipe (other calibrations, layers kept in float) are bounded by the plain quantized model: the same
graph with more of it in float is not faster, so when the plain one cannot win, its retries are not built.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgefleet.converter.runners import Runner
from edgefleet.converter.timing.head_to_head import NOISE, precision_rank
from edgefleet.converter.timing.latency import settle
from edgefleet.core.errors import ConversionError

MARGIN = 1.10  # evidence from different moments (evaluation runs are not interleaved): a generous margin
TIMING_MARGIN = 1.05  # inside the interleaved rounds the runners share the machine's load
MIN_EVIDENCE = 3  # samples before a candidate's fastest run is read as its lower bound
DUEL_RUNS = 3  # runs per block against the best candidate that confirm a verdict
DUEL_BLOCKS = 3  # blocks of each, alternating: one run after another would time the other's spinning threads
DUEL_WARMUP = 3  # untimed runs of the suspect before the first block
RATIO_BLOCKS, RATIO_RUNS = 7, 5  # the paired ratio that decides whether mixed precision is worth building


class Pruned(ConversionError):
    """A candidate stopped because it cannot beat one already inside the budget."""


@dataclass
class Pruner:
    """The candidates inside the budget so far, by median latency (ms), and the rule that drops the rest.

    `beaten` reads the evidence; `confirm` checks a verdict head to head: the best candidate and the suspect
    run alternately on the same input, at the same moment, so a burst of load on a shared machine cannot make
    a fast candidate look slow. The search prunes only confirmed verdicts."""

    margin: float = MARGIN
    accepted: dict[str, float] = field(default_factory=dict)
    runners: dict[str, Callable[[], Runner]] = field(default_factory=dict)  # how to run each accepted one
    _live: dict[str, Runner] = field(default_factory=dict)

    def accept(self, name: str, samples_ms: Sequence[float], runner: Callable[[], Runner] | None = None) -> None:
        if samples_ms:
            self.accepted[name] = statistics.median(samples_ms)
            if runner is not None:
                self.runners[name] = runner

    def best(self) -> tuple[str, float] | None:
        if not self.accepted:
            return None
        name = min(self.accepted, key=lambda n: self.accepted[n])
        return name, self.accepted[name]

    def beaten(self, samples_ms: Sequence[float]) -> str | None:
        """Why a candidate with these run times cannot win (None while it still can)."""
        found = self.best()
        if found is None or len(samples_ms) < MIN_EVIDENCE:
            return None
        name, median = found
        fastest = min(samples_ms)
        if fastest <= median * self.margin:
            return None
        return (
            f"pruned: its fastest run took {fastest:.3g} ms, over {self.margin:.2f}x the {median:.3g} ms median of "
            f"{name}, which is inside the budget"
        )

    def confirm(self, run: Runner, feeds: dict[str, np.ndarray], runs: int = DUEL_RUNS) -> str | None:
        """The verdict of alternating blocks of `runs` runs against the best candidate (None: it can still win,
        or there is nothing to run it against)."""
        duel = self._duel(run, feeds, DUEL_BLOCKS, runs)
        if duel is None:
            return None
        name, mine, theirs = duel
        best_mine, their_median = min(x for b in mine for x in b), statistics.median(x for b in theirs for x in b)
        if best_mine <= their_median * self.margin:
            return None
        count = sum(len(b) for b in mine)
        return (
            f"pruned: head to head, its fastest of {count} runs took {best_mine:.3g} ms, over {self.margin:.2f}x "
            f"the {their_median:.3g} ms median of {name}, which is inside the budget"
        )

    def ratio(
        self, run: Runner, feeds: dict[str, np.ndarray], blocks: int = RATIO_BLOCKS, runs: int = RATIO_RUNS
    ) -> tuple[str, float] | None:
        """Head to head against the best candidate: its name, and the median over alternating blocks of this
        runner's block median divided by the best's in the same block pair (None: nothing to run it against)."""
        duel = self._duel(run, feeds, blocks, runs)
        if duel is None:
            return None
        name, mine, theirs = duel
        pairs = [statistics.median(a) / statistics.median(b) for a, b in zip(mine, theirs, strict=True)]
        return name, statistics.median(pairs)

    def _duel(
        self, run: Runner, feeds: dict[str, np.ndarray], blocks: int, runs: int
    ) -> tuple[str, list[list[float]], list[list[float]]] | None:
        """Alternating blocks of `runs` timed runs, the best candidate's first: its name, then this runner's and
        the best's times per block."""
        found = self.best()
        if found is None or found[0] not in self.runners:
            return None
        name = found[0]
        try:
            best = self._live.get(name) or self._live.setdefault(name, self.runners[name]())
        except ConversionError:
            return None
        mine: list[list[float]] = []
        theirs: list[list[float]] = []
        for _ in range(DUEL_WARMUP):  # a freshly compiled model's first runs are slow (OpenVINO's kernels)
            run(feeds)
        for _ in range(blocks):
            for runner, times in ((best, theirs), (run, mine)):
                settle()  # the other runtime's worker threads (ORT spins them after each run) go quiet first
                runner(feeds)  # untimed: caches warm again
                block = []
                for _ in range(runs):
                    start = time.perf_counter()
                    runner(feeds)
                    block.append((time.perf_counter() - start) * 1000.0)
                times.append(block)
        return name, mine, theirs


def retries_cannot_win(
    pruner: Pruner,
    bound: Runner,
    feeds: dict[str, np.ndarray],
    precision: str,
    precisions: Mapping[str, str],
    hint_note: str = "",
) -> str | None:
    """Why no retry of a plain INT8 candidate that missed the bar can ship (None: one can).

    A retry (another calibration, the mixed preset, the head or the costly layers in float: NNCF accuracy
    control, the ORT exclusion search) is the same graph with as much or more of it in float, so it runs no
    faster than `bound` (the plain model, compiled with the fastest hint a retry gets). When `bound` is not
    faster, head to head, than the best candidate inside the budget, no retry can be; and within the head to
    head's noise (converter.timing.head_to_head) the tie-break prefers that candidate where its precision is higher.
    The retries are then not built: NNCF accuracy control alone takes minutes on a 10 MB model."""
    return retries_verdict(pruner.ratio(bound, feeds), precision, precisions, hint_note)


def retries_verdict(
    duel: tuple[str, float] | None, precision: str, precisions: Mapping[str, str], hint_note: str = ""
) -> str | None:
    """retries_cannot_win's rule, from the head to head's (best candidate, paired median ratio)."""
    if duel is None:
        return None
    name, ratio = duel
    higher = name in precisions and precision_rank(precisions[name]) < precision_rank(precision)
    if ratio < (1 / (1 + NOISE) if higher else 1.0):
        return None
    return (
        f"head to head the plain model{hint_note} ran {ratio:.2f}x the time of {name}, which is inside the budget; "
        "its retries keep as much or more in float and run no faster"
        + (f", and within {1 + NOISE:.2f}x the tie-break prefers {name}'s higher precision" if higher else "")
    )


def timing_losers(times_ms: Mapping[str, Sequence[float]], margin: float = TIMING_MARGIN) -> dict[str, str]:
    """Runners (all inside the budget) that cannot be the fastest: fastest run > margin × the best median."""
    medians = {name: statistics.median(v) for name, v in times_ms.items() if len(v) >= MIN_EVIDENCE}
    if len(medians) < 2:
        return {}
    best = min(medians, key=lambda n: medians[n])
    return {
        name: f"fastest run {min(times_ms[name]):.3g} ms > {margin:.2f}x {best}'s median {medians[best]:.3g} ms"
        for name in medians
        if name != best and min(times_ms[name]) > medians[best] * margin
    }


class TimedRunner:
    """Wraps a runner: records each call's wall time and raises Pruned once the pruner says it cannot win."""

    def __init__(self, run: Runner, pruner: Pruner | None) -> None:
        self._run, self._pruner = run, pruner
        self.samples_ms: list[float] = []

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self._run(feeds)
        self.samples_ms.append((time.perf_counter() - start) * 1000.0)
        if self._pruner is not None and self._pruner.beaten(self.samples_ms):
            reason = self._pruner.confirm(self._run, feeds)
            if reason:
                raise Pruned(reason)
            self._pruner = None  # head to head it can still win: evaluate it in full
        return out
