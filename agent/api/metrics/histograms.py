"""Latency histograms with fixed buckets, counters and gauges, exposed on the agent's /metrics page.

A histogram keeps counts per fixed bucket (milliseconds), so memory is constant and p50/p95/p99 are estimated by
interpolating inside the bucket that holds the rank (as Prometheus' histogram_quantile does), clamped to the smallest
and largest value seen. Everything here is thread-safe. The page (agent/api/metrics/page.py,
agent/api/metrics/exposition.py) is the Prometheus text format, or OpenMetrics when the scraper asks for it, with the
process metrics; latencies in seconds (base units).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Bucket upper bounds in milliseconds: 25 µs for tiny models on a fast CPU up to 10 s for a cold GPU.
DEFAULT_BUCKETS_MS: tuple[float, ...] = (
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
)  # fmt: skip


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds_ms: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket (not cumulative); one more than bounds: the last is +Inf
    count: int
    sum_ms: float
    min_ms: float
    max_ms: float

    def quantile(self, q: float) -> float | None:
        """Estimated q-quantile in ms (None when empty)."""
        if self.count == 0:
            return None
        rank = q * self.count
        seen = 0
        for index, count in enumerate(self.counts):
            if count and seen + count >= rank:
                lower = self.bounds_ms[index - 1] if index > 0 else 0.0
                upper = self.bounds_ms[index] if index < len(self.bounds_ms) else self.max_ms
                lower, upper = max(lower, self.min_ms), min(upper, self.max_ms)
                estimate = lower + (upper - lower) * (rank - seen) / count
                return min(max(estimate, self.min_ms), self.max_ms)
            seen += count
        return self.max_ms

    def percentiles(self) -> tuple[float | None, float | None, float | None]:
        return self.quantile(0.50), self.quantile(0.95), self.quantile(0.99)


class Histogram:
    def __init__(self, bounds_ms: Sequence[float] = DEFAULT_BUCKETS_MS) -> None:
        if list(bounds_ms) != sorted(set(bounds_ms)) or not bounds_ms:
            raise ValueError("histogram bounds must be distinct and increasing")
        self.bounds_ms = tuple(float(b) for b in bounds_ms)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._counts = [0] * (len(self.bounds_ms) + 1)
        self._count, self._sum = 0, 0.0
        self._min, self._max = math.inf, 0.0

    def observe(self, ms: float) -> None:
        index = bisect.bisect_left(self.bounds_ms, ms)  # a value equal to a bound falls in that bucket (le)
        with self._lock:
            self._counts[index] += 1
            self._count += 1
            self._sum += ms
            self._min = min(self._min, ms)
            self._max = max(self._max, ms)

    def snapshot(self, reset: bool = False) -> HistogramSnapshot:
        with self._lock:
            snap = HistogramSnapshot(
                self.bounds_ms, tuple(self._counts), self._count, self._sum,
                self._min if self._count else 0.0, self._max,
            )  # fmt: skip
            if reset:
                self._reset()
        return snap


class Counter:
    """A monotonically increasing count per label values, with the time each series was created."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}
        self._created: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            if labels not in self._values:
                self._created[labels] = time.time()
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def created(self, labels: tuple[str, ...]) -> float | None:
        with self._lock:
            return self._created.get(labels)

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return sorted(self._values.items())

    def total(self) -> float:
        with self._lock:
            return sum(self._values.values())


ERROR_KINDS = ("bad-request", "not-found", "too-large", "overloaded", "runtime", "timeout")


class ServiceMetrics:
    """What the inference service counts: latency per (model, provider), requests by status, refusals and
    failures by kind, model-run failures per model (the only count health sees), connections."""

    def __init__(self, bounds_ms: Sequence[float] = DEFAULT_BUCKETS_MS) -> None:
        self._bounds = tuple(bounds_ms)
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str, str], Histogram] = {}  # (model, bundle, provider)
        self.requests = Counter()  # (model, code)
        self.errors = Counter()  # (kind,): every answer but 200, refusals and runtime failures
        self.failures = Counter()  # (model,): the model's own run failed on valid input
        self.swaps = Counter()  # (model,)
        self.closed = Counter()  # (reason,): connections closed by the server
        self.queue_depth: Callable[[], int] = lambda: 0
        self.in_flight: Callable[[], int] = lambda: 0
        self.open_connections: Callable[[], int] = lambda: 0
        self.models: Callable[[], Iterable[tuple[str, str, str]]] = lambda: ()  # (model, bundle, provider)
        self.slot_of: Callable[[str], str] = lambda _model: "default"  # the slot a model name is served in
        self.field_accuracy: Callable[[], Iterable[tuple[str, float, int]]] = lambda: ()  # (model, acc, n)

    def latency(self, model: str, bundle_id: str, provider: str) -> Histogram:
        key = (model, bundle_id, provider)
        histogram = self._latency.get(key)
        if histogram is None:
            with self._lock:
                histogram = self._latency.setdefault(key, Histogram(self._bounds))
        return histogram

    def latencies(self) -> list[tuple[tuple[str, str, str], Histogram]]:
        with self._lock:
            return sorted(self._latency.items())

    def observe(self, model: str, bundle_id: str, provider: str, ms: float) -> None:
        self.latency(model, bundle_id, provider).observe(ms)

    def error(self, kind: str) -> None:
        self.errors.inc(kind)

    def failure(self, model: str) -> None:
        self.failures.inc(model)

    def snapshot(self, model: str | None = None) -> HistogramSnapshot:
        """All latencies (of one model, or of every model) merged into one snapshot."""
        with self._lock:
            chosen = [h for (m, _, _), h in self._latency.items() if model is None or m == model]
        counts = [0] * (len(self._bounds) + 1)
        total, sum_ms, low, high = 0, 0.0, math.inf, 0.0
        for histogram in chosen:
            snap = histogram.snapshot()
            counts = [a + b for a, b in zip(counts, snap.counts, strict=True)]
            total += snap.count
            sum_ms += snap.sum_ms
            if snap.count:
                low, high = min(low, snap.min_ms), max(high, snap.max_ms)
        return HistogramSnapshot(
            tuple(float(b) for b in self._bounds), tuple(counts), total, sum_ms, low if total else 0.0, high
        )


__all__ = ["DEFAULT_BUCKETS_MS", "ERROR_KINDS", "Counter", "Histogram", "HistogramSnapshot", "ServiceMetrics"]
