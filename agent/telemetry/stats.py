"""What the agent measures about itself: inference latency, request counts, CPU, memory, temperature."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import psutil

from edgefleet.agent.telemetry.generation_window import GenerationWindow
from edgefleet.core.messages import LatencySummary


class RequestStats:
    """Latencies and counts since the last report, plus a bounded rolling window for percentiles. For a generative
    model the latency of a request is its time per output token (what the build's `latency.median_ms` is), and
    `generation` holds the window's token figures."""

    def __init__(self, window: int = 4096) -> None:
        self._lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=window)
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: answered, False: runtime failure
        self._requests = 0
        self._errors = 0  # the model's own failures: what telemetry's `errors` and the rollout judge count
        self._refused: dict[str, int] = {}  # refusals by kind since start: the caller's fault, never the model's
        self._probes = 0
        self._live: deque[float] = deque(maxlen=1024)  # arrival times of the latest live requests
        self._since = time.monotonic()
        self.generation = GenerationWindow()

    def record(self, latency_ms: float) -> None:
        with self._lock:
            self._latencies.append(latency_ms)
            self._requests += 1
            self._outcomes.append(True)
            self._live.append(time.monotonic())

    def record_answered(self) -> None:
        """A request answered without a latency to report (a generation of a single token has no time per token)."""
        with self._lock:
            self._requests += 1
            self._outcomes.append(True)
            self._live.append(time.monotonic())

    def record_probe(self, latency_ms: float) -> None:
        """A probe request (agent/quality/probe.py): in the latency window and the health record, not in `requests`."""
        with self._lock:
            self._latencies.append(latency_ms)
            self._outcomes.append(True)
            self._probes += 1

    def live_within(self, seconds: float) -> int:
        """Live requests answered in the last `seconds` (up to the 1,024 latest)."""
        since = time.monotonic() - seconds
        with self._lock:
            return sum(1 for t in self._live if t >= since)

    def take_probes(self) -> int:
        """Probe requests since the last call."""
        with self._lock:
            probes, self._probes = self._probes, 0
        return probes

    def record_error(self, kind: str) -> None:
        """A refused request (bad input, full queue): the caller's fault, not the model's, so not an error. Counted
        by `kind` for telemetry's errors_by_kind."""
        with self._lock:
            self._refused[kind] = self._refused.get(kind, 0) + 1

    def refused_by_kind(self) -> dict[str, int]:
        """Refusals since start, by kind (cumulative, as the local API's error counters are)."""
        with self._lock:
            return dict(self._refused)

    def record_failure(self) -> None:
        """The runtime failed on valid input: counts against the model's health."""
        with self._lock:
            self._errors += 1
            self._outcomes.append(False)

    def reset_health(self) -> None:
        """A new model starts with a clean record: no old failures, no old latencies in its percentiles."""
        with self._lock:
            self._outcomes.clear()
            self._latencies.clear()

    def failure_ratio(self, window: int) -> tuple[float, int]:
        """Share of runtime failures among the last `window` valid requests, and how many there were."""
        with self._lock:
            recent = list(self._outcomes)[-window:]
        if not recent:
            return 0.0, 0
        return recent.count(False) / len(recent), len(recent)

    def snapshot(self) -> tuple[LatencySummary, int, int, float]:
        """(latency over the rolling window, requests and errors since last call, seconds since last call)."""
        with self._lock:
            values = np.fromiter(self._latencies, dtype=np.float64)
            requests, errors = self._requests, self._errors
            now = time.monotonic()
            window_s, self._since = now - self._since, now
            self._requests = self._errors = 0
        if values.size == 0:
            return LatencySummary(count=0, p50_ms=None, p95_ms=None, p99_ms=None), requests, errors, window_s
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        summary = LatencySummary(
            count=int(values.size),
            p50_ms=round(float(p50), 4),
            p95_ms=round(float(p95), 4),
            p99_ms=round(float(p99), 4),
        )
        return summary, requests, errors, window_s


class ResourceSampler:
    def __init__(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the baseline

    def cpu_percent(self) -> float:
        return float(self._process.cpu_percent(None))

    def rss_mb(self) -> float:
        return round(self._process.memory_info().rss / 2**20, 1)

    def temperature_c(self) -> float | None:
        """Hottest sensor psutil can read (Jetson thermal zones included); None where there are none."""
        reader = getattr(psutil, "sensors_temperatures", None)
        if reader is None:
            return None
        try:
            readings = [t.current for sensors in reader().values() for t in sensors if t.current]
        except (OSError, RuntimeError):
            return None
        return round(max(readings), 1) if readings else None
