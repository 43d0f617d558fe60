"""A shadow model: a second bundle run on a sampled share of live requests, compared with the served one,
never answering anyone.

The request path only decides whether to mirror (a counter, no randomness, no numpy) and hands the request's
inputs and the served outputs to a short queue. One worker thread runs the shadow under a CPU budget (a token
bucket: the shadow may use `cpu_budget` of one core on average; beyond it, and when the queue is full,
requests are not mirrored and are counted as dropped). Its outputs go only into the comparison: per output,
by the rule of the served bundle's golden check for that output (class or per-position agreement, or SQNR,
cosine and max-abs error for continuous outputs), accumulated since the shadow started. Comparisons are made
in batches (up to 64 mirrored requests wait, the rest are scored at each report), so the worker holds the
interpreter only briefly.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from edgefleet.core.bundle.manifest import OutputCheck
from edgefleet.core.messages import LatencySummary, OutputScore, ShadowReport
from edgefleet.core.quality.output_rules import SQNR_CAP_DB

log = logging.getLogger(__name__)

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class ShadowConfig:
    share: float = 0.1  # of live requests mirrored to the shadow
    cpu_budget: float = 0.25  # share of one core the shadow may use on average
    queue: int = 4  # requests waiting for the shadow; beyond it they are dropped


@dataclass
class _Tally:
    """What one output's comparison has accumulated (all additive, so memory does not grow)."""

    rows: int = 0
    agree: int = 0
    top_k: int = 0
    requests: int = 0
    within: int = 0
    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    norm_shadow: float = 0.0
    norm_served: float = 0.0
    max_abs: float = 0.0
    mismatched: int = 0
    k: int = 0
    extra: dict[str, float] = field(default_factory=dict)


_SCORE_BATCH = 64  # mirrored requests kept unscored at most (scored then, or at the next report)


def _rows(values: np.ndarray) -> np.ndarray:
    """Requests stacked on axis 0 → one row per sample (class axis last)."""
    return values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values.reshape(-1, 1)


class ShadowRunner:
    def __init__(
        self, bundle_id: str, run: Runner, checks: Mapping[str, OutputCheck], config: ShadowConfig | None = None
    ) -> None:
        self.bundle_id, self._run, self.checks = bundle_id, run, dict(checks)
        self.config = config or ShadowConfig()
        self._queue: queue.Queue[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]] | None] = queue.Queue(
            maxsize=self.config.queue
        )
        self._lock = threading.Lock()
        self._tallies: dict[str, _Tally] = {}
        self._latencies: deque[float] = deque(maxlen=1024)
        self._unscored: list[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = []
        self._offered = self._sampled = 0  # requests seen, requests chosen: the share is kept exactly
        self._burst = self.config.cpu_budget  # the bucket holds one second's worth of budget
        self._tokens, self._refilled = self._burst, time.monotonic()  # CPU seconds the shadow may spend now
        self._cost = 0.0  # expected CPU seconds of one mirrored request (moving average of what runs cost)
        self.mirrored = 0
        self.dropped = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._work, name="shadow", daemon=True)
        self._thread.start()

    def rebase(self, checks: Mapping[str, OutputCheck]) -> None:
        """The served bundle changed: compare against it from now on, by its rules, from zero."""
        self._score_pending()
        with self._lock:
            self.checks = dict(checks)
            self._tallies.clear()
            self._latencies.clear()
            self._unscored.clear()
            self.mirrored = self.dropped = self.failures = 0

    # --- request path
    def offer(self, inputs: Mapping[str, np.ndarray], served: Mapping[str, np.ndarray]) -> None:
        self._offered += 1
        if int(self._offered * self.config.share) <= self._sampled:
            return
        self._sampled += 1
        if not self._charge():
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((dict(inputs), served))
        except queue.Full:
            self.dropped += 1
            with self._lock:
                self._tokens += self._cost  # not run: give the charge back

    def _charge(self) -> bool:
        """Take a request's expected CPU from the bucket when there is budget left; the worker settles the
        difference with what the run really cost."""
        now = time.monotonic()
        with self._lock:
            self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self.config.cpu_budget)
            self._refilled = now
            if self._tokens <= 0:
                return False
            self._tokens -= self._cost
            return True

    # --- worker
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            inputs, served = item
            begin, cpu = time.perf_counter(), time.thread_time()
            try:
                outputs = self._run(inputs)
            except Exception as err:  # a shadow that fails never touches serving; it is counted and logged
                self.failures += 1
                log.warning("shadow %s failed on a mirrored request: %s", self.bundle_id, err)
                continue
            finally:
                spent = max(time.thread_time() - cpu, 0.0)
                with self._lock:
                    self._tokens -= spent - self._cost  # the estimate was charged when it was admitted
                    self._cost = spent if self._cost == 0 else 0.8 * self._cost + 0.2 * spent
            latency_ms = (time.perf_counter() - begin) * 1000
            with self._lock:
                self.mirrored += 1
                self._latencies.append(latency_ms)
                self._unscored.append((outputs, served))
                full = len(self._unscored) >= _SCORE_BATCH
            if full:
                self._score_pending()

    def _score_pending(self) -> None:
        """Compare the mirrored requests not yet scored, in batches (vectorized, off the request path)."""
        with self._lock:
            pairs, self._unscored = self._unscored, []
            names = dict.fromkeys(name for _, served in pairs for name in served)
            for name in names:
                self._compare(name, [(shadow.get(name), served[name]) for shadow, served in pairs if name in served])

    def _compare(self, name: str, pairs: list[tuple[np.ndarray | None, np.ndarray]]) -> None:
        check = self.checks.get(name)
        tally = self._tallies.setdefault(name, _Tally())
        groups: dict[tuple[object, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
        for got, want in pairs:
            if got is None or got.shape != want.shape:
                tally.mismatched += 1
            else:
                groups.setdefault((want.shape, want.dtype.str, got.dtype.str), []).append((got, want))
        for members in groups.values():
            got_all = np.stack([g for g, _ in members])
            want_all = np.stack([w for _, w in members])
            count = len(members)
            tally.requests += count
            if check is None or check.rule != "continuous":
                g, w = _rows(got_all), _rows(want_all)
                integer = np.issubdtype(want_all.dtype, np.integer)
                got_top = g.reshape(-1) if integer else g.argmax(axis=1)
                want_top = w.reshape(-1) if integer else w.argmax(axis=1)
                tally.rows += int(got_top.size)
                tally.agree += int(np.sum(got_top == want_top))
                if check is not None and check.top_k and not integer and g.shape[1] > check.top_k:
                    top = np.argpartition(-g, kth=check.top_k - 1, axis=1)[:, : check.top_k]
                    tally.top_k += int(np.sum(np.any(top == want_top[:, None], axis=1)))
                    tally.k = check.top_k
                continue
            a = got_all.reshape(count, -1).astype(np.float64)
            b = want_all.reshape(count, -1).astype(np.float64)
            diff = a - b
            errors = np.abs(diff).max(axis=1) if a.shape[1] else np.zeros(count)
            tally.signal += float(np.sum(b * b))
            tally.noise += float(np.sum(diff * diff))
            tally.dot += float(np.sum(a * b))
            tally.norm_shadow += float(np.sum(a * a))
            tally.norm_served += float(np.sum(b * b))
            tally.max_abs = max(tally.max_abs, float(errors.max(initial=0.0)))
            limit = check.max_abs_error
            tally.within += count if limit is None else int(np.sum(errors <= limit))

    # --- telemetry
    def report(self) -> ShadowReport:
        self._score_pending()
        with self._lock:
            scores = [self._score(name, tally) for name, tally in self._tallies.items()]
            latencies = np.fromiter(self._latencies, dtype=np.float64)
            mirrored, dropped, failures = self.mirrored, self.dropped, self.failures
        latency = None
        if latencies.size:
            p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
            latency = LatencySummary(
                count=int(latencies.size), p50_ms=round(float(p50), 4), p95_ms=round(float(p95), 4),
                p99_ms=round(float(p99), 4),
            )  # fmt: skip
        return ShadowReport(
            bundle_id=self.bundle_id,
            requests=mirrored,
            agreement=min((s.score for s in scores), default=None) if mirrored else None,
            per_output=scores,
            latency=latency,
            dropped=dropped,
            failures=failures,
        )

    def _score(self, name: str, t: _Tally) -> OutputScore:
        check = self.checks.get(name)
        if t.requests == 0:
            return OutputScore(output=name, rule=check.rule if check else "continuous", score=0.0, passed=False,
                               detail={"mismatched": float(t.mismatched)})  # fmt: skip
        if check is None or check.rule != "continuous":
            agreement = t.agree / max(1, t.rows)
            detail = {"agreement": agreement, "rows": float(t.rows), "mismatched": float(t.mismatched)}
            passed = check is None or check.min_agreement is None or agreement >= check.min_agreement
            if t.k:
                detail["top_k"], detail["k"] = t.top_k / max(1, t.rows), float(t.k)
            return OutputScore(
                output=name, rule=check.rule if check else "class-agreement", score=round(agreement, 6),
                passed=passed, detail=detail,
            )  # fmt: skip
        sqnr = (
            SQNR_CAP_DB
            if t.noise == 0
            else (0.0 if t.signal == 0 else min(SQNR_CAP_DB, 10 * np.log10(t.signal / t.noise)))
        )
        norms = np.sqrt(t.norm_shadow * t.norm_served)
        cos = 1.0 if norms == 0 and t.noise == 0 else (float(t.dot / norms) if norms else 0.0)
        if not np.all(np.isfinite([cos, sqnr, t.max_abs])):  # NaN or infinity in an answer: no figure holds
            return OutputScore(output=name, rule="continuous", score=0.0, passed=False,
                               detail={"non_finite": 1.0, "mismatched": float(t.mismatched)})  # fmt: skip
        passed = (
            (check.min_sqnr_db is None or sqnr >= check.min_sqnr_db)
            and (check.min_cosine is None or cos >= check.min_cosine)
            and (check.max_abs_error is None or t.max_abs <= check.max_abs_error)
        )
        detail = {"sqnr_db": float(sqnr), "cosine": cos, "max_abs": t.max_abs,
                  "sample_agreement": t.within / t.requests, "mismatched": float(t.mismatched)}  # fmt: skip
        return OutputScore(output=name, rule="continuous", score=round(cos, 6), passed=passed, detail=detail)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop mirroring; returns once the worker finished its request (so the shadow session can close)."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("shadow %s worker did not take the stop request", self.bundle_id)
        self._thread.join(timeout_s)
