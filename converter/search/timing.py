"""The time stage: every candidate inside the budget, at each thread count the profile's devices use, in
interleaved rounds; a candidate stops being timed once it cannot be the fastest (converter.timing.pruning). Then
the final round: the best of them re-timed together, and that decides (converter.timing.head_to_head).

Both return what they measured; neither changes the candidates they are given.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgefleet.converter import deadline, phases
from edgefleet.converter.runners import Runner
from edgefleet.converter.search.attempts import Attempt
from edgefleet.converter.search.choose import Candidate, Choice
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.timing import head_to_head as h2h
from edgefleet.converter.timing.latency import LatencyStats, interleaved_latency
from edgefleet.converter.timing.pruning import timing_losers
from edgefleet.core.errors import ConversionError

TIMING_ROUND_S = 0.4  # per candidate and round: 7 interleaved rounds of about this long
TIMING_ROUNDS = 7
MIN_RUNS = 5  # timed runs per block, however slow the model
MIN_RUNS_UNDER_BUDGET = 2  # ... when --time-budget leaves too little for that
MIN_H2H_ROUNDS = 3  # under --time-budget, a head to head of fewer rounds is not run
CLEAR_GAP = 1.5  # under --time-budget, a finalist this much slower than the best's p90 is not re-timed


def _time_scale(ws: Workspace, candidates: int, ms: float) -> float:
    """Under --time-budget, the share of the usual timing that fits in what is left: the interleaved rounds, then a
    head to head of up to three, each block at least MIN_RUNS runs of about `ms` (the slowest candidate's
    evaluation median) and one untimed run. Blocks get shorter, down to a quarter and MIN_RUNS_UNDER_BUDGET runs;
    the rounds stay as many (`_fit` takes rounds away when even that does not fit). 1.0 without a budget."""
    if ws.deadline is None:
        return 1.0
    block = max(TIMING_ROUND_S, (MIN_RUNS + 1) * ms / 1000.0)
    usual = TIMING_ROUNDS * block * candidates + h2h.ROUNDS * block * min(candidates, 3)
    return max(0.25, min(1.0, _left(ws) / usual))


def _min_runs(scale: float) -> int:
    return MIN_RUNS if scale >= 1.0 else max(MIN_RUNS_UNDER_BUDGET, round(MIN_RUNS * scale))


def _left(ws: Workspace) -> float:
    """Seconds left for timing under --time-budget, the bundle's share kept (`ws.finish_s`: its golden set, the
    peak-memory probe, signing); infinite without a budget."""
    return float("inf") if ws.deadline is None else ws.deadline - time.monotonic() - ws.finish_s


@dataclass(frozen=True)
class TimingFit:
    """How a timing stage runs: rounds, each block's target seconds and fewest runs, untimed warm-up runs."""

    rounds: int
    round_s: float
    min_runs: int
    warmup: int

    def cost_s(self, blocks: int, ms: float, extra_runs: int = 0) -> float:
        """About how long `blocks` runners take at `ms` a run: warm-up (or sizing) runs, then per round one
        untimed run and the block (sized to round_s, at least min_runs), and the wait for other threads."""
        runs = max(self.min_runs, math.ceil(self.round_s * 1000.0 / max(ms, 1e-3)))
        per_block = (self.warmup + extra_runs + self.rounds * (1 + runs)) * ms / 1000.0 + self.rounds * SETTLE_S
        return blocks * per_block


SETTLE_S = 0.05  # per block, waiting for another runtime's threads to go quiet (converter.timing.latency.settle)


def fit_timing(
    usual: TimingFit, left: float, blocks: int, ms: float, fewest_rounds: int, extra_runs: int = 0
) -> TimingFit | None:
    """`usual` when it fits in `left` seconds; else as many rounds as fit, of one timed run each after one untimed
    warm-up run (at least `fewest_rounds`, at most the usual); None when even that does not fit."""
    if usual.cost_s(blocks, ms, extra_runs) <= left:
        return usual
    one = TimingFit(1, 0.0, 1, min(1, usual.warmup))
    per_round = one.cost_s(blocks, ms, extra_runs) - TimingFit(0, 0.0, 1, one.warmup).cost_s(blocks, ms, extra_runs)
    rounds = min(usual.rounds, math.floor((left - TimingFit(0, 0.0, 1, one.warmup).cost_s(blocks, ms, extra_runs))
                                          / max(per_round, 1e-9)))  # fmt: skip
    return None if rounds < fewest_rounds else TimingFit(rounds, 0.0, 1, one.warmup)


@dataclass
class Timing:
    """What the time stage measured."""

    threads: list[int]  # thread counts timed at; the first decides the choice
    latencies: dict[str, LatencyStats] = field(default_factory=dict)  # at the first thread count
    by_threads: dict[str, dict[int, LatencyStats]] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)  # candidates timing stopped, and why
    failed: dict[str, str] = field(default_factory=dict)  # candidates that could not be run for timing, and why
    runners: dict[str, Runner] = field(default_factory=dict)  # at the first thread count, for the final round


def time_candidates(
    request: SearchRequest, ws: Workspace, profile: str, attempts: Sequence[Attempt], threads: list[int], prune: bool
) -> Timing:
    """Time every measurable candidate inside the budget at each thread count in `threads`, all interleaved; with
    `prune`, a candidate stops being timed once it cannot be the fastest: it is named in `stopped`, with why, and
    keeps the figures of the rounds it ran."""
    result = Timing(list(threads))
    first = threads[0]
    timed_ones: dict[str, Attempt] = {}  # name → attempt, in order: what would be timed
    for attempt in attempts:
        if attempt.built.passed and attempt.status.measurable:  # else it cannot be chosen, so it is not timed
            timed_ones.setdefault(attempt.built.spec.name, attempt)
    if not timed_ones:
        return result
    slowest = max(_evaluation_ms(a) for a in timed_ones.values())
    scale = _time_scale(ws, len(timed_ones), slowest)
    usual = TimingFit(TIMING_ROUNDS, TIMING_ROUND_S * scale, _min_runs(scale), max(2, round(10 * scale)))
    blocks = len(timed_ones) * len(threads)
    fit = fit_timing(usual, _left(ws), blocks, slowest, 1)
    if fit is None and all(a.built.eval_ms for a in timed_ones.values()):  # under --time-budget, none left for it
        deadline.cut("timing", f"not run: {max(_left(ws), 0.0):.0f} s were left, one round of {blocks} runners at "
                     f"about {slowest:.0f} ms needs more; each candidate's latency is the median of its evaluation "
                     f"runs at {first} threads")  # fmt: skip
        for name, attempt in timed_ones.items():
            values = attempt.built.eval_ms
            stats = LatencyStats(statistics.median(values), float(np.percentile(values, 90)), len(values))
            result.by_threads[name] = {first: stats}
            result.latencies[name] = stats
        return result
    fit = fit or TimingFit(1, 0.0, 1, 1)  # a candidate without evaluation runs (from the cache) is timed once at least
    if fit is not usual:
        deadline.cut("timing", f"{fit.rounds} round(s) of {fit.min_runs} run instead of {usual.rounds} of at least "
                     f"{usual.min_runs}: {max(_left(ws), 0.0):.0f} s were left for {blocks} runners at about "
                     f"{slowest:.0f} ms a run")  # fmt: skip
    runners: dict[tuple[str, int], Runner] = {}
    for name, attempt in timed_ones.items():
        try:
            for count in threads:
                runners[(name, count)] = attempt.built.runner(count, request.output_names)
        except ConversionError as err:
            result.failed[name] = str(err)
            runners = {k: v for k, v in runners.items() if k[0] != name}
    if not runners:
        return result
    counts = "/".join(str(t) for t in threads)
    ws.progress(f"{profile}: timing {len(runners)} candidates at {counts} threads, interleaved")
    runtime_of = {a.built.spec.name: a.built.spec.runtime for a in attempts}

    def losers(times: dict[str, list[float]]) -> dict[str, str]:
        found = timing_losers({k.rsplit("@", 1)[0]: v for k, v in times.items() if k.endswith(f"@{first}")})
        result.stopped.update(found)
        return {k: found[k.rsplit("@", 1)[0]] for k in times if k.rsplit("@", 1)[0] in found}

    with phases.phase("timing"):
        timed = interleaved_latency(
            {f"{n}@{t}": run for (n, t), run in runners.items()},
            request.evaluation,
            rounds=fit.rounds,
            round_s=fit.round_s,
            min_runs=fit.min_runs,
            warmup=fit.warmup,
            prune=losers if prune else None,
            on_round=lambda done, total: phases.step("timing", done, total, f"{len(runners)} candidates"),
            runtimes={f"{n}@{t}": runtime_of[n] for n, t in runners},
        )
    for (name, count), _run in runners.items():
        result.by_threads.setdefault(name, {})[count] = timed[f"{name}@{count}"]
    result.latencies = {name: stats[first] for name, stats in result.by_threads.items() if first in stats}
    result.runners = {name: run for (name, count), run in runners.items() if count == first}
    return result


def _evaluation_ms(attempt: Attempt) -> float:
    """The median of a candidate's evaluation runs (0 when it came from the cache unevaluated)."""
    return statistics.median(attempt.built.eval_ms) if attempt.built.eval_ms else 0.0


@dataclass
class FinalRound:
    """The choice after the final round, the figures it changed, and the candidates it refuses as pruned."""

    choice: Choice
    latencies: dict[str, LatencyStats]
    by_threads: dict[str, dict[int, LatencyStats]]
    pruned: dict[str, str] = field(default_factory=dict)  # timing stopped them and they were no finalist: why
    head_to_head: h2h.HeadToHead | None = None
    notes: list[str] = field(default_factory=list)


def final_round(request: SearchRequest, ws: Workspace, profile: str, choice: Choice, timing: Timing) -> FinalRound:
    """Re-time the best candidates together and let converter.timing.head_to_head decide (`choice` is the timing
    phase's); candidates the timing phase stopped and that are not finalists are refused as pruned."""
    out = FinalRound(choice, dict(timing.latencies), {k: dict(v) for k, v in timing.by_threads.items()})
    pool = ([choice.chosen] if choice.chosen else []) + choice.rejected
    eligible = {
        c.name: c
        for c in pool
        if c.latency_ms is not None and c.measured and c.name in timing.runners and (c is choice.chosen or _slower(c))
    }
    names = h2h.finalists(
        {n: c.latency_ms or 0.0 for n, c in eligible.items()}, {n: c.runtime for n, c in eligible.items()}
    )
    if ws.deadline is not None and names:  # under --time-budget, a runtime's leader far behind is not re-timed
        best = timing.latencies[names[0]]
        far = [n for n in names[1:] if timing.latencies[n].median_ms > CLEAR_GAP * best.p90_ms]
        out.notes += [f"{n}: not re-timed head to head under the time budget: its median is over {CLEAR_GAP}x the "
                      f"p90 of {names[0]} ({timing.latencies[n].median_ms:.3g} ms against {best.p90_ms:.3g} ms)"
                      for n in far]  # fmt: skip
        names = [n for n in names if n not in far]
    if len(names) >= 2:
        _head_to_head(request, ws, profile, out, {n: eligible[n] for n in names}, timing)
    out.pruned = {n: f"pruned: timing stopped early: {why}" for n, why in timing.stopped.items() if n not in names}
    out.choice = replace(out.choice, rejected=[
        replace(c, rejected=out.pruned[c.name]) if c.name in out.pruned else c for c in out.choice.rejected
    ])  # fmt: skip
    return out


def _slower(candidate: Candidate) -> bool:
    return bool(candidate.rejected and candidate.rejected.startswith("slower"))


def _head_to_head(
    request: SearchRequest,
    ws: Workspace,
    profile: str,
    out: FinalRound,
    finalists: dict[str, Candidate],
    timing: Timing,
) -> None:
    threads = timing.threads[0]
    slowest = max((c.latency_ms or 0.0) for c in finalists.values())
    scale = _time_scale(ws, len(finalists), slowest)
    usual = TimingFit(h2h.ROUNDS, h2h.ROUND_S * scale, _min_runs(scale), h2h.WARMUP_RUNS)
    # 3 sizing runs per finalist first; fewer than MIN_H2H_ROUNDS rounds would not decide anything
    fit = fit_timing(usual, _left(ws), len(finalists), slowest, MIN_H2H_ROUNDS, extra_runs=3)
    if fit is None:
        names = ", ".join(finalists)
        deadline.cut("head to head", f"not run: {max(_left(ws), 0.0):.0f} s were left, {MIN_H2H_ROUNDS} rounds of "
                     f"{names} at about {slowest:.0f} ms need more; the timing's medians decide")  # fmt: skip
        out.notes.append(f"head to head of {', '.join(finalists)} not run: the time budget is spent")
        return
    if fit is not usual:
        deadline.cut("head to head", f"{fit.rounds} rounds of {fit.min_runs} run instead of {usual.rounds} of at "
                     f"least {usual.min_runs}")  # fmt: skip
    # more rounds while under phase_s only where that fits too
    more = fit is usual and fit.cost_s(len(finalists), slowest, 3) + h2h.PHASE_S * scale <= _left(ws)
    ws.progress(f"{profile}: head to head: {', '.join(finalists)} at {threads} threads")
    started = time.monotonic()
    with phases.phase("timing"):
        every, per_round, runs = h2h.time_finalists(
            {n: timing.runners[n] for n in finalists},
            request.evaluation,
            rounds=fit.rounds,
            max_rounds=h2h.MAX_ROUNDS if more else fit.rounds,
            round_s=fit.round_s,
            phase_s=h2h.PHASE_S * scale,
            min_runs=fit.min_runs,
            on_round=lambda done, total: phases.step("timing", done, total, f"head to head of {len(finalists)}"),
            runtimes={n: c.runtime for n, c in finalists.items()},
        )
    traits = {n: h2h.Finalist(n, c.runtime, c.precision, c.size_bytes) for n, c in finalists.items()}
    decision = h2h.decide(per_round, traits)
    medians = {n: statistics.median(v) for n, v in per_round.items()}
    for name in finalists:
        stats = LatencyStats(medians[name], float(np.percentile(every[name], 90)), len(every[name]))
        out.latencies[name] = stats
        out.by_threads.setdefault(name, {})[threads] = stats
    rounds = len(next(iter(per_round.values())))
    record = h2h.HeadToHead(threads=threads, rounds=rounds, warmup_runs=h2h.WARMUP_RUNS)
    record.finalists = [
        {"name": n, "runtime": c.runtime, "precision": c.precision, "size_bytes": c.size_bytes,
         "timing_phase_median_ms": c.latency_ms, "median_ms": medians[n], "runs_per_round": runs[n],
         "round_medians_ms": [round(v, 4) for v in per_round[n]]}
        for n, c in finalists.items()
    ]  # fmt: skip
    record.fastest, record.within_noise = decision.fastest, list(decision.tied[1:])
    record.chosen, record.why, record.seconds = decision.winner, decision.why, time.monotonic() - started
    out.head_to_head = record
    out.notes.append(f"head to head ({rounds} rounds, {threads} threads): {decision.winner}: {decision.why}")
    out.choice = apply(out.choice, decision, medians)


def apply(choice: Choice, decision: h2h.Decision, medians: Mapping[str, float]) -> Choice:
    """`choice` (the timing phase's) with the head to head's winner: each finalist's latency becomes its median
    there, and a finalist that lost says how; the other candidates keep their reasons."""
    pool = ([choice.chosen] if choice.chosen else []) + choice.rejected
    won = medians[decision.winner]
    winner, rejected = None, []
    for cand in pool:
        if cand.name not in medians:
            rejected.append(cand)
            continue
        cand = replace(cand, latency_ms=medians[cand.name], rejected=None)
        ratio = medians[cand.name] / won
        if cand.name == decision.winner:
            winner = cand
        elif cand.name in decision.tied:
            rejected.append(replace(cand, rejected=(
                f"slower or tied head to head: {medians[cand.name]:.3f} ms median vs {won:.3f} ms for "
                f"{decision.winner} ({ratio:.2f}x), within the noise of the fastest ({decision.fastest}); the "
                f"tie-break ({h2h.TIE_BREAK}) prefers {decision.winner}"
            )))  # fmt: skip
        else:
            rejected.append(replace(cand, rejected=(
                f"slower head to head: {medians[cand.name]:.3f} ms median vs {won:.3f} ms for {decision.winner} "
                f"({ratio:.2f}x)"
            )))  # fmt: skip
    if winner is None:
        raise ValueError(f"the head to head's winner {decision.winner} is not among the candidates")
    return Choice(winner, rejected, choice.accuracy_floor)
