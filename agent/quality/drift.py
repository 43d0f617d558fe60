"""Input and output drift on the device: streaming histograms over a sliding window of live requests, scored
against the bundle's reference statistics (PSI, and KS where the bins are ordered).

The request path only appends (inputs, outputs) to a short bounded queue (O(1), no numpy work). A worker
thread bins queued requests in batches into a ring of per-request bin counts: the window histogram is the sum
of the ring, so memory is fixed (window × bins per feature) and an old request leaves the window exactly when a
new one arrives. The worker keeps to a CPU budget (2 % of one core by default): when requests arrive faster
than it may bin them, new requests are skipped (counted) while the queue is full, so at high rates the window holds a
sample of the traffic, and the request path is never slowed by a backlog.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.messages import DriftScore
from edgefleet.core.quality.drift_stats import DEFAULT_BANDS, DriftReference, band, counts_batch, ks, psi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftConfig:
    window: int = 512  # requests in the sliding window
    min_samples: int = 128  # a score is reported once the window holds this many requests
    bands: tuple[float, float] = DEFAULT_BANDS  # moderate from, drift above
    queue: int = 32  # requests waiting for the worker; while it is full, new ones are skipped
    batch: int = 16  # the worker wakes once this many wait (or every second)
    cpu_budget: float = 0.02  # share of one core the worker may use (it paces itself to it)


def load_reference(bundle_dir: Path, path: str | None) -> DriftReference | None:
    """The bundle's reference statistics; None for bundles built without them (drift is then not reported)."""
    if path is None:
        return None
    try:
        return DriftReference.model_validate_json((bundle_dir / path).read_bytes())
    except (OSError, ValueError) as err:
        log.warning("drift reference %s unusable, drift not reported: %s", path, err)
        return None


def _finite(request: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]) -> bool:
    """No NaN or Infinity in any floating tensor of the request: only such requests move the statistics (a model
    that takes NaN as "missing" still never shifts a histogram with it)."""
    return all(
        not isinstance(t, np.ndarray) or t.dtype.kind not in "fc" or bool(np.isfinite(t).all())
        for side in request
        for t in side.values()
    )


class DriftMonitor:
    """One bundle's live window. `observe` is called on the request path; `scores` from the telemetry loop."""

    def __init__(self, reference: DriftReference, config: DriftConfig | None = None) -> None:
        self.reference, self.config = reference, config or DriftConfig()
        features = reference.features
        self._ring = [np.zeros((self.config.window, f.bins), dtype=np.int32) for f in features]
        self._total = [np.zeros(f.bins, dtype=np.int64) for f in features]
        self._proportions = [np.asarray(f.proportions, dtype=np.float64) for f in features]
        self._next = 0  # ring slot the next request fills
        self._filled = 0
        self._pending: collections.deque[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = (
            collections.deque()
        )
        self._queue = self.config.queue
        self._lock = threading.Lock()  # guards the ring and totals (worker writes, telemetry reads)
        self._draining = threading.Lock()  # one drain at a time, so a report sees the worker's batch finished
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.observed = 0
        self.non_finite = 0  # requests left out of the window: NaN or Infinity in an input or output
        self._binned = 0
        self._batch = self.config.batch
        self._thread = threading.Thread(target=self._work, name="drift", daemon=True)
        self._thread.start()

    # --- request path
    def observe(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """O(1), no lock, no numpy: the request path pays well under a microsecond."""
        self.observed += 1  # a statistic: an increment lost to a race between request threads does not matter
        pending = self._pending
        if len(pending) < self._queue:  # full: the worker is over its CPU budget, this request is skipped
            pending.append((inputs, outputs))
            if len(pending) >= self._batch and not self._wake.is_set():
                self._wake.set()

    @property
    def skipped(self) -> int:
        """Requests that left the queue unbinned (the worker's CPU budget or a full queue)."""
        return max(0, self.observed - self._binned - len(self._pending))

    # --- worker
    def _work(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            cpu = time.thread_time()
            self.drain()
            spent = time.thread_time() - cpu
            if spent > 0 and self.config.cpu_budget > 0:
                # Paced to the budget: at high request rates the queue overflows meanwhile, so the window
                # holds a sample of the traffic (the latest requests before each drain) instead of all of it.
                self._stop.wait(spent / self.config.cpu_budget - spent)

    def drain(self) -> None:
        """Bin every queued request into the window (the worker calls it; tests and benches may too)."""
        with self._draining:
            while self._pending:
                batch = [self._pending.popleft() for _ in range(min(self._batch, len(self._pending)))]
                self._binned += len(batch)
                finite = [request for request in batch if _finite(request)]
                self.non_finite += len(batch) - len(finite)
                if finite:
                    self._add(self._bin(finite))
                time.sleep(0)  # let request threads take the interpreter between chunks

    def _bin(self, batch: list[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]) -> list[np.ndarray]:
        """Per feature, the bin counts of each request in `batch`: (requests, bins), zeros where it lacks one."""
        stacked: dict[tuple[str, str], list[tuple[list[int], np.ndarray]]] = {}
        for kind, side in (("input", 0), ("output", 1)):
            for name in {f.tensor for f in self.reference.features if f.kind == kind}:
                groups: dict[tuple[object, ...], list[int]] = {}
                for index, request in enumerate(batch):
                    tensor = request[side].get(name)
                    if isinstance(tensor, np.ndarray):
                        groups.setdefault((tensor.shape, tensor.dtype.str), []).append(index)
                stacked[(kind, name)] = [
                    (members, np.stack([batch[i][side][name] for i in members])) for members in groups.values()
                ]  # requests of one shape are binned together
        per_feature = []
        for feature in self.reference.features:
            rows = np.zeros((len(batch), feature.bins), dtype=np.int32)
            for members, tensors in stacked[(feature.kind, feature.tensor)]:
                try:
                    binned = counts_batch(feature, tensors)
                except (ValueError, IndexError, TypeError) as err:  # a tensor the reference does not fit
                    log.debug("drift feature %s skipped: %s", feature.name, err)
                    continue
                if len(members) == len(batch):
                    rows = binned
                else:
                    rows[members] = binned
            per_feature.append(rows)
        return per_feature

    def _add(self, per_feature: list[np.ndarray]) -> None:
        window = self.config.window
        count = min(len(per_feature[0]), window)
        with self._lock:
            slots = (self._next + np.arange(count)) % window
            for ring, total, rows in zip(self._ring, self._total, per_feature, strict=True):
                rows = rows[-count:]
                total -= ring[slots].sum(axis=0)
                ring[slots] = rows
                total += rows.sum(axis=0)
            self._next = int((self._next + count) % window)
            self._filled = min(self._filled + count, window)

    # --- telemetry
    def scores(self) -> list[DriftScore]:
        """PSI (and KS) per feature over the window; nothing until `min_samples` requests were seen."""
        self.drain()
        with self._lock:
            filled = self._filled
            totals = [t.copy() for t in self._total]
        if filled < self.config.min_samples:
            return []
        result = []
        for feature, expected, live in zip(self.reference.features, self._proportions, totals, strict=True):
            if live.sum() <= 0:
                continue
            value = psi(expected, live)
            result.append(
                DriftScore(
                    name=feature.name,
                    kind=feature.kind,
                    psi=round(value, 5),
                    ks=round(ks(expected, live), 5) if feature.feature != "classes" else None,
                    band=band(value, self.config.bands),
                    samples=filled,
                )
            )
        return result

    def memory_bytes(self) -> int:
        """The window's own memory (ring and totals), without the queued requests."""
        return sum(r.nbytes for r in self._ring) + sum(t.nbytes for t in self._total)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
