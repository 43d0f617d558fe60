"""The scheduler's account of one slot: how long its work waited for its turn (queue) and how long it computed, how
many runs it made, how many requests those runs answered, and how often it yielded to real-time work.

It has the shape of the core message `SlotTiming` (queue_ms and compute_ms as latency summaries, batches,
batched_requests, yields), so a telemetry window maps onto it one to one: `SlotTiming(**window.fields())`.
Bounded: each window keeps at most `keep` samples of each kind (a reservoir, never a growing list).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Summary:
    """A window's latencies: count, p50, p95, p99 in ms (None without samples); LatencySummary's fields."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @staticmethod
    def of(samples: list[float], count: int) -> Summary:
        if not samples:
            return Summary(count, None, None, None)
        p50, p95, p99 = (float(v) for v in np.percentile(np.asarray(samples), [50, 95, 99]))
        return Summary(count, p50, p95, p99)


@dataclass(frozen=True)
class TimingWindow:
    """One window of a slot's scheduling, field for field the core message `SlotTiming`."""

    queue_ms: Summary
    compute_ms: Summary
    batches: int
    batched_requests: int
    yields: int

    def fields(self) -> dict[str, Any]:
        """Keyword arguments for `SlotTiming` (edgefleet/core/messages.py)."""
        return {
            "queue_ms": self.queue_ms.__dict__ if self.queue_ms.count else None,
            "compute_ms": self.compute_ms.__dict__ if self.compute_ms.count else None,
            "batches": self.batches,
            "batched_requests": self.batched_requests,
            "yields": self.yields,
        }


class _Reservoir:
    """At most `keep` samples standing for every sample seen (uniform), and the count seen."""

    def __init__(self, keep: int, rng: random.Random) -> None:
        self.keep, self.rng, self.samples, self.count = keep, rng, list[float](), 0

    def add(self, value: float) -> None:
        self.count += 1
        if len(self.samples) < self.keep:
            self.samples.append(value)
        elif (index := self.rng.randrange(self.count)) < self.keep:
            self.samples[index] = value


class SlotTimer:
    """Counts one slot's scheduling; thread-safe. `window()` reads the figures since the last window and starts a new
    one; `total()` reads them without resetting (a benchmark's whole run)."""

    def __init__(self, keep: int = 2048) -> None:
        self._keep, self._rng, self._lock = keep, random.Random(0), threading.Lock()
        self._reset()
        self.all_requests = 0  # since start, never reset: what answered at all

    def _reset(self) -> None:
        self._queue, self._compute = _Reservoir(self._keep, self._rng), _Reservoir(self._keep, self._rng)
        self._batches = self._requests = self._yields = 0

    def queued(self, ms: float) -> None:
        """One piece of work waited `ms` for its turn."""
        with self._lock:
            self._queue.add(ms)

    def ran(self, ms: float, requests: int = 1) -> None:
        """One run took `ms` and answered `requests` requests (a batch counts once)."""
        with self._lock:
            self._compute.add(ms)
            self._batches += 1
            self._requests += requests
            self.all_requests += requests

    def yielded(self) -> None:
        """This slot's work stood aside so that real-time work could run."""
        with self._lock:
            self._yields += 1

    def total(self) -> TimingWindow:
        with self._lock:
            return self._window()

    def window(self) -> TimingWindow:
        with self._lock:
            window = self._window()
            self._reset()
            return window

    def _window(self) -> TimingWindow:
        return TimingWindow(
            Summary.of(self._queue.samples, self._queue.count),
            Summary.of(self._compute.samples, self._compute.count),
            self._batches,
            self._requests,
            self._yields,
        )


__all__ = ["SlotTimer", "Summary", "TimingWindow"]
