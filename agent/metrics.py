"""Latency histograms with fixed buckets, counters and gauges, and their Prometheus text exposition.

A histogram keeps counts per fixed bucket (milliseconds), so memory is constant and p50/p95/p99 are
estimated by interpolating inside the bucket that holds the rank (as Prometheus' histogram_quantile
does), clamped to the smallest and largest value seen. Everything here is thread-safe.
Exposition follows the Prometheus text format 0.0.4; latencies are exported in seconds (base units).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Bucket upper bounds in milliseconds: 25 µs for tiny models on a fast CPU up to 10 s for a cold GPU.
DEFAULT_BUCKETS_MS: tuple[float, ...] = (
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
    """A monotonically increasing count per label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return sorted(self._values.items())

    def total(self) -> float:
        with self._lock:
            return sum(self._values.values())


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


class Exposition:
    """Builds one Prometheus text page: HELP and TYPE once per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, names: Sequence[str] = (), values: Sequence[str] = ()) -> None:
        self._lines.append(f"{name}{_labels(names, values)} {_number(value)}")

    def histogram_seconds(
        self, name: str, snap: HistogramSnapshot, names: Sequence[str] = (), values: Sequence[str] = ()
    ) -> None:
        cumulative = 0
        for bound, count in zip((*snap.bounds_ms, math.inf), snap.counts, strict=True):
            cumulative += count
            le = "+Inf" if math.isinf(bound) else repr(bound / 1000)
            labels = _labels(names, values, 'le="' + le + '"')
            self._lines.append(f"{name}_bucket{labels} {cumulative}")
        self._lines.append(f"{name}_sum{_labels(names, values)} {_number(snap.sum_ms / 1000)}")
        self._lines.append(f"{name}_count{_labels(names, values)} {snap.count}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


ERROR_KINDS = ("bad-request", "not-found", "too-large", "overloaded", "runtime", "timeout")


class ServiceMetrics:
    """What the inference service counts: latency per (model, provider), requests by status, errors by kind."""

    def __init__(self, bounds_ms: Sequence[float] = DEFAULT_BUCKETS_MS) -> None:
        self._bounds = tuple(bounds_ms)
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str, str], Histogram] = {}  # (model, bundle, provider)
        self.requests = Counter()  # (model, code)
        self.errors = Counter()  # (kind,)
        self.swaps = Counter()  # (model,)
        self.queue_depth: Callable[[], int] = lambda: 0
        self.in_flight: Callable[[], int] = lambda: 0
        self.models: Callable[[], Iterable[tuple[str, str, str]]] = lambda: ()  # (model, bundle, provider)
        self.field_accuracy: Callable[[], Iterable[tuple[str, float, int]]] = lambda: ()  # (model, acc, n)

    def latency(self, model: str, bundle_id: str, provider: str) -> Histogram:
        key = (model, bundle_id, provider)
        histogram = self._latency.get(key)
        if histogram is None:
            with self._lock:
                histogram = self._latency.setdefault(key, Histogram(self._bounds))
        return histogram

    def observe(self, model: str, bundle_id: str, provider: str, ms: float) -> None:
        self.latency(model, bundle_id, provider).observe(ms)

    def error(self, kind: str) -> None:
        self.errors.inc(kind)

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

    def exposition(self) -> str:
        page = Exposition()
        page.family("edgefleet_inference_latency_seconds", "histogram", "Inference latency inside the service.")
        with self._lock:
            latency = sorted(self._latency.items())
        for (model, bundle, provider), histogram in latency:
            page.histogram_seconds(
                "edgefleet_inference_latency_seconds",
                histogram.snapshot(),
                ("model", "bundle_id", "provider"),
                (model, bundle, provider),
            )
        page.family("edgefleet_requests_total", "counter", "HTTP inference requests by model and status code.")
        for (model, code), value in self.requests.items():
            page.sample("edgefleet_requests_total", value, ("model", "code"), (model, code))
        page.family("edgefleet_errors_total", "counter", "Refused or failed requests by kind.")
        seen = dict(self.errors.items())
        for kind in sorted(set(ERROR_KINDS) | {k[0] for k in seen}):
            page.sample("edgefleet_errors_total", seen.get((kind,), 0.0), ("kind",), (kind,))
        page.family("edgefleet_model_swaps_total", "counter", "Hot swaps of a served model.")
        for (model,), value in self.swaps.items():
            page.sample("edgefleet_model_swaps_total", value, ("model",), (model,))
        page.family("edgefleet_queue_depth", "gauge", "Requests admitted and waiting for an inference slot.")
        page.sample("edgefleet_queue_depth", self.queue_depth())
        page.family("edgefleet_in_flight", "gauge", "Requests running inference now.")
        page.sample("edgefleet_in_flight", self.in_flight())
        page.family("edgefleet_model_info", "gauge", "Models served, with their bundle and provider.")
        for model, bundle, provider in self.models():
            page.sample("edgefleet_model_info", 1, ("model", "bundle_id", "provider"), (model, bundle, provider))
        field = list(self.field_accuracy())
        page.family("edgefleet_field_accuracy", "gauge", "Share of correct answers among those given feedback.")
        for model, accuracy, _ in field:
            page.sample("edgefleet_field_accuracy", accuracy, ("model",), (model,))
        page.family("edgefleet_field_feedback", "gauge", "Feedbacks the field accuracy is computed over.")
        for model, _, samples in field:
            page.sample("edgefleet_field_feedback", samples, ("model",), (model,))
        return page.text()


__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_BUCKETS_MS",
    "Counter",
    "Exposition",
    "Histogram",
    "HistogramSnapshot",
    "ServiceMetrics",
]
