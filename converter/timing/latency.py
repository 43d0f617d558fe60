"""Interleaved latency: rounds (A, B, C, A, B, C, ...) so a noisy neighbour slows every candidate alike, medians
reported, and `settle`, which waits out the previous runtime's worker threads before a block is timed."""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.converter.runners import Runner
from edgefleet.core.tensors import Dataset


@dataclass(frozen=True)
class LatencyStats:
    median_ms: float
    p90_ms: float
    runs: int


def interleaved_latency(
    runners: Mapping[str, Runner],
    dataset: Dataset,
    *,
    rounds: int = 7,
    runs_per_round: int = 30,
    warmup: int = 10,
    round_s: float | None = None,
    prune: Callable[[dict[str, list[float]]], Mapping[str, str]] | None = None,
    on_round: Callable[[int, int], None] | None = None,
    runtimes: Mapping[str, str] | None = None,
    min_runs: int = 5,
) -> dict[str, LatencyStats]:
    """Median per-inference latency of each runner, measured in interleaved rounds on the same samples.

    `round_s`: size each round to about that many seconds per runner (`min_runs` to `runs_per_round` runs, from the
    slowest runner's warm-up), so a slow model costs rounds × round_s, not rounds × 30 runs. `prune`: after each
    round, gets every runner's times so far and names the runners to stop timing (with why); they keep the
    figures of the rounds they ran. `runtimes` (runner → runtime): wait for the previous runner's threads only
    where the runtime changes (None: before every block).
    """
    samples = [dataset.sample(i % len(dataset)) for i in range(max(runs_per_round, warmup))]
    warm: list[float] = []
    for run in runners.values():
        for feeds in samples[:warmup]:
            start = time.perf_counter()
            run(feeds)
            warm.append((time.perf_counter() - start) * 1000.0)
    if round_s is not None and warm:
        slowest = max(statistics.median(warm[i : i + warmup]) for i in range(0, len(warm), max(1, warmup)))
        runs_per_round = max(min_runs, min(runs_per_round, math.ceil(round_s * 1000.0 / max(slowest, 1e-3))))
    samples = samples[:runs_per_round]
    times: dict[str, list[float]] = {name: [] for name in runners}
    active = list(runners)
    previous: str | None = None
    for index in range(rounds):
        for name in active:
            run = runners[name]
            if runtime_changes(runtimes, previous, name):
                settle()  # the previous runtime's worker threads (ORT spins them after each run) go quiet first
            previous = name
            run(samples[0])  # untimed: caches and this runtime's own threads warm again
            for feeds in samples:
                start = time.perf_counter()
                run(feeds)
                times[name].append((time.perf_counter() - start) * 1000.0)
        if on_round is not None:
            on_round(index + 1, rounds)
        if prune is not None and index + 1 < rounds:
            dropped = prune({name: times[name] for name in active})
            active = [name for name in active if name not in dropped]
    return {
        name: LatencyStats(
            median_ms=statistics.median(values),
            p90_ms=float(np.percentile(values, 90)),
            runs=len(values),
        )
        for name, values in times.items()
    }


SETTLE_WINDOW_S = 0.01  # the other threads' CPU time is read over windows this long
SETTLE_IDLE = 0.05  # ... until they used less than this share of one core
SETTLE_QUIET = 2  # ... in this many windows in a row (on a loaded machine a spinning thread can miss a window)
SETTLE_MAX_S = 0.5  # never wait longer (a busy thread that is not a runtime's worker)


def runtime_changes(runtimes: Mapping[str, str] | None, previous: str | None, name: str) -> bool:
    """Whether a block of `name` after one of `previous` should wait for `settle`: always without `runtimes`; else
    only across runtimes. Within one runtime the rotated order gives every runner the same neighbours, and the
    wait costs ~0.1 s a block after a 2-thread ONNX Runtime session (its workers spin that long)."""
    if runtimes is None or previous is None:
        return True
    return runtimes.get(previous) != runtimes.get(name)


def settle(max_s: float = SETTLE_MAX_S) -> float:
    """Wait until no other thread of this process is running, at most `max_s`; returns the seconds waited.

    After a run, ONNX Runtime's intra-op workers spin for a while before they sleep (OpenVINO's briefly too); a
    runner timed meanwhile shares the cores with them (an OpenVINO model on 2 cores ran several times slower
    right after an ONNX Runtime session). Each runtime keeps its own settings, as the device runs it alone: this
    only waits for the previous runtime's threads to go quiet, read from /proc/self/task/*/schedstat (the CPU
    time of each thread). Without that file it waits a fixed 50 ms."""
    start = time.monotonic()
    me = str(threading.get_native_id())
    before, since, quiet = _others_cpu_ns(me), start, 0
    if before is None:
        time.sleep(min(max_s, 0.05))
        return time.monotonic() - start
    while time.monotonic() - start < max_s:
        time.sleep(SETTLE_WINDOW_S)
        now, at = _others_cpu_ns(me), time.monotonic()
        if now is None:
            break
        quiet = quiet + 1 if now - before < SETTLE_IDLE * (at - since) * 1e9 else 0
        if quiet >= SETTLE_QUIET:
            break
        before, since = now, at
    return time.monotonic() - start


def _others_cpu_ns(me: str) -> int | None:
    """CPU nanoseconds used so far by this process's threads other than `me` (None: not readable here)."""
    try:
        tasks = [tid for tid in os.listdir("/proc/self/task") if tid != me]
    except OSError:
        return None
    total, read = 0, 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
            read += 1
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total if read or not tasks else None
