"""The search's timing phases: every candidate inside the budget, at each thread count the profile's devices use,
in interleaved rounds; a candidate stops being timed once it cannot be the fastest (converter.pruning). Then
the best of them are re-timed together, and that decides (converter.head_to_head)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from edgefleet.converter import head_to_head as h2h
from edgefleet.converter import phases
from edgefleet.converter.context import Context
from edgefleet.converter.measure import LatencyStats, Runner, interleaved_latency
from edgefleet.converter.pruning import timing_losers
from edgefleet.converter.recipes import Candidate
from edgefleet.core.errors import ConversionError

if TYPE_CHECKING:
    from edgefleet.converter.search import ProfileSearch

TIMING_ROUND_S = 0.4  # per candidate and round: 7 interleaved rounds of about this long


def measure(ctx: Context, result: ProfileSearch) -> dict[str, Runner]:
    """Time every measurable candidate inside the budget at each thread count the profile's devices use, all
    interleaved; a candidate stops being timed once it cannot be the fastest (converter.pruning): it is named in
    `result.stopped`, with why, and keeps the figures of the rounds it ran. Returns the runners at the first
    thread count (the one that decides), for the head to head (converter.head_to_head)."""
    runners: dict[tuple[str, int], Runner] = {}
    for built, _target, status, _order in result.built:
        if built.error is not None or built.gate is not None or not status.measurable:
            continue  # failed or outside the budget: it cannot be chosen, so it is not timed
        if built.spec.name in {n for n, _ in runners}:
            continue
        try:
            for threads in result.threads:
                runners[(built.spec.name, threads)] = built.runner(threads, list(ctx.reference))
        except ConversionError as err:
            built.error = str(err)
            runners = {k: v for k, v in runners.items() if k[0] != built.spec.name}
    if not runners:
        return {}
    counts = "/".join(str(t) for t in result.threads)
    ctx.progress(f"{result.profile.name}: timing {len(runners)} candidates at {counts} threads, interleaved")
    first = result.threads[0]
    stopped: dict[str, str] = {}
    runtime_of = {built.spec.name: built.spec.runtime for built, *_rest in result.built}

    def prune(times: dict[str, list[float]]) -> dict[str, str]:
        losers = timing_losers({k.rsplit("@", 1)[0]: v for k, v in times.items() if k.endswith(f"@{first}")})
        stopped.update(losers)
        return {k: losers[k.rsplit("@", 1)[0]] for k in times if k.rsplit("@", 1)[0] in losers}

    with phases.phase("timing"):
        timed = interleaved_latency(
            {f"{n}@{t}": run for (n, t), run in runners.items()},
            ctx.evaluation,
            round_s=TIMING_ROUND_S,
            prune=prune if result.prune else None,
            on_round=lambda done, total: phases.step("timing", done, total, f"{len(runners)} candidates"),
            runtimes={f"{n}@{t}": runtime_of[n] for n, t in runners},
        )
    for (name, threads), _run in runners.items():
        result.by_threads.setdefault(name, {})[threads] = timed[f"{name}@{threads}"]
    result.latencies = {name: stats[first] for name, stats in result.by_threads.items() if first in stats}
    result.stopped = stopped
    return {name: run for (name, threads), run in runners.items() if threads == first}


def final_round(ctx: Context, result: ProfileSearch, runners: Mapping[str, Runner]) -> None:
    """Re-time the best candidates together and let converter.head_to_head decide (`result.choice` is the timing
    phase's choice on entry, the head to head's on return); candidates the timing phase stopped and that are not
    finalists are refused as pruned."""
    choice = result.choice
    assert choice is not None
    pool = ([choice.chosen] if choice.chosen else []) + choice.rejected
    eligible = {
        c.name: c
        for c in pool
        if c.latency_ms is not None and c.measured and c.name in runners and (c is choice.chosen or _slower(c))
    }
    names = h2h.finalists(
        {n: c.latency_ms or 0.0 for n, c in eligible.items()}, {n: c.runtime for n, c in eligible.items()}
    )
    if len(names) >= 2:
        _head_to_head(ctx, result, {n: eligible[n] for n in names}, runners)
    stopped = {n: why for n, why in result.stopped.items() if n not in names}
    for built, *_rest in result.built:
        if built.spec.name in stopped and built.error is None:
            built.error = f"pruned: timing stopped early: {stopped[built.spec.name]}"
    assert result.choice is not None
    result.choice = replace(result.choice, rejected=[
        replace(c, rejected=f"pruned: timing stopped early: {stopped[c.name]}") if c.name in stopped else c
        for c in result.choice.rejected
    ])  # fmt: skip


def _slower(candidate: Candidate) -> bool:
    return bool(candidate.rejected and candidate.rejected.startswith("slower"))


def _head_to_head(
    ctx: Context, result: ProfileSearch, finalists: dict[str, Candidate], runners: Mapping[str, Runner]
) -> None:
    threads = result.threads[0]
    ctx.progress(f"{result.profile.name}: head to head: {', '.join(finalists)} at {threads} threads")
    started = time.monotonic()
    with phases.phase("timing"):
        every, per_round, runs = h2h.time_finalists(
            {n: runners[n] for n in finalists},
            ctx.evaluation,
            on_round=lambda done, total: phases.step("timing", done, total, f"head to head of {len(finalists)}"),
            runtimes={n: c.runtime for n, c in finalists.items()},
        )
    traits = {n: h2h.Finalist(n, c.runtime, c.precision, c.size_bytes) for n, c in finalists.items()}
    decision = h2h.decide(per_round, traits)
    medians = {n: statistics.median(v) for n, v in per_round.items()}
    for name in finalists:
        stats = LatencyStats(medians[name], float(np.percentile(every[name], 90)), len(every[name]))
        result.latencies[name] = stats
        result.by_threads.setdefault(name, {})[threads] = stats
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
    result.head_to_head = record
    result.notes.append(f"head to head ({rounds} rounds, {threads} threads): {decision.winner}: {decision.why}")
    result.choice = h2h.apply(result.choice, decision, medians)  # type: ignore[arg-type]
