"""The agent's side of the benchmark farm (edgefleet/core/farm_messages.py): measure candidate bundles for the host.

Requests are taken one at a time (a second one waiting at most; more are refused as busy). Each candidate is
fetched and verified through the agent's normal transfer path into a scratch folder (never the store: it is never
served or committed), must be marked `benchmark_only` and built for a profile this device runs, and is measured in
a separate, time-bounded worker process (selection_worker.py) pinned to the share of the cores the request allows,
at a lower priority, with the providers this device really has and its own thread settings. The scratch folder is
removed after each candidate.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from edgefleet.agent.runtime import custom_ops
from edgefleet.agent.runtime.selection.policy import NoProviderError, Policy, choose
from edgefleet.agent.runtime.selection.process import WorkerUnavailable
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import EdgefleetError
from edgefleet.core.farm_messages import BenchmarkRequest, BenchmarkResult, CandidateFigures
from edgefleet.core.messages import MessageError, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.quality.golden import GoldenSet
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

# (bundle id, an empty scratch folder) -> (the verified, unpacked bundle folder, its manifest); raises on refusal.
Fetch = Callable[[str, Path], tuple[Path, Manifest]]


def cores_for(share: float, available: Sequence[int] | None = None) -> list[int]:
    """The cores a measuring worker may use: `share` of this process's cores, at least one, the last ones (the
    runtime's own threads tend to start on the first)."""
    cores = sorted(available if available is not None else _own_cores())
    count = max(1, math.floor(share * len(cores) + 1e-9))
    return cores[-count:]


def _own_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


class BenchmarkService:
    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        device_id: str,
        profiles: Sequence[str],
        threads: int,
        policy: Policy,
        fetch: Fetch,
        scratch: Path,
        max_cpu_share: float = 0.5,
    ) -> None:
        self.conn, self.topics, self.device_id = conn, topics, device_id
        self.profiles, self.threads, self.policy = tuple(profiles), threads, policy
        self.fetch, self.scratch, self.max_cpu_share = fetch, scratch, max_cpu_share
        self._queue: queue.Queue[BenchmarkRequest] = queue.Queue(maxsize=1)
        self._seen: deque[str] = deque(maxlen=64)  # the host re-sends until answered: take each request once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="benchmark", daemon=True)

    def start(self) -> BenchmarkService:
        shutil.rmtree(self.scratch, ignore_errors=True)  # left by a process that died mid-measurement
        self._thread.start()
        self.conn.subscribe(self.topics.benchmark_request(self.device_id), self._on_request, qos=1)
        return self

    def stop(self) -> None:
        self._stop.set()

    def _on_request(self, topic: str, payload: bytes, retained: bool) -> None:
        if retained:  # a request is for now; one left retained on the broker is stale
            return
        try:
            request = decode(BenchmarkRequest, payload)
        except MessageError as err:
            log.warning("benchmark request refused: %s", err)
            return
        if request.request_id in self._seen:
            return
        self._seen.append(request.request_id)
        if self.max_cpu_share <= 0:
            self._answer(request, BenchmarkResult(
                request_id=request.request_id, device_id=self.device_id, profile=self.profiles[0], ok=False,
                error="this device takes no benchmark requests (--benchmark-max-cpu-share 0)",
            ))  # fmt: skip
            return
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self._answer(request, BenchmarkResult(
                request_id=request.request_id, device_id=self.device_id, profile=self.profiles[0], ok=False,
                error="busy: another benchmark request is being measured",
            ))  # fmt: skip

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                request = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                result = self.measure(request)
            except Exception as err:  # a bug answers the request with its reason; the agent goes on
                log.exception("benchmark request %s failed", request.request_id)
                result = BenchmarkResult(
                    request_id=request.request_id, device_id=self.device_id, profile=self.profiles[0], ok=False,
                    error=f"{type(err).__name__}: {err}",
                )  # fmt: skip
            self._answer(request, result)

    def _answer(self, request: BenchmarkRequest, result: BenchmarkResult) -> None:
        try:
            self.conn.publish(self.topics.benchmark_result(self.device_id, request.client_id), result.encode(), qos=1)
        except EdgefleetError as err:
            log.warning("benchmark result for %s not sent: %s", request.request_id, err)

    def measure(self, request: BenchmarkRequest) -> BenchmarkResult:
        deadline = time.monotonic() + request.timeout_s
        cores = cores_for(min(request.cpu_share, self.max_cpu_share))
        policy = self.policy.model_copy(update={"rounds": request.rounds})
        figures = []
        for bundle_id in request.bundle_ids:
            if time.monotonic() >= deadline:
                figures.append(CandidateFigures(bundle_id=bundle_id, ok=False, error="not measured: out of time"))
                continue
            folder = self.scratch / f"{request.request_id[:32]}-{len(figures)}"
            try:
                figures.append(self._candidate(bundle_id, folder, policy, cores, request.calls))
            except (EdgefleetError, WorkerUnavailable) as err:
                figures.append(CandidateFigures(bundle_id=bundle_id, ok=False, error=str(err), threads=self.threads))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        share = len(cores) / max(1, len(_own_cores()))
        log.info("benchmark %s: measured %d candidate(s) on %d core(s)", request.request_id, len(figures), len(cores))
        return BenchmarkResult(
            request_id=request.request_id, device_id=self.device_id, profile=self.profiles[0], cpu_share=share,
            candidates=figures,
        )  # fmt: skip

    def _candidate(
        self, bundle_id: str, folder: Path, policy: Policy, cores: list[int], calls: int
    ) -> CandidateFigures:
        folder.mkdir(parents=True, exist_ok=True)
        bundle_dir, manifest = self.fetch(bundle_id, folder)
        if not manifest.benchmark_only:
            raise EdgefleetError(f"{bundle_id} is not marked benchmark-only; only candidates are measured here")
        if manifest.profile not in self.profiles:
            raise EdgefleetError(f"{bundle_id} is built for {manifest.profile}; this device runs {self.profiles}")
        golden = GoldenSet.load(bundle_dir / manifest.golden.path, manifest.inputs, manifest.outputs)
        prepared = custom_ops.prepare(bundle_dir / manifest.model_path, manifest, folder / "custom-ops")
        allowed = [p for p in dict.fromkeys(manifest.providers) if p not in policy.exclude]
        from edgefleet.agent.runtime.selection.worker import (
            measure_in_worker,  # a device never asked carries none of it
        )

        found = measure_in_worker(
            allowed, manifest_json=manifest.model_dump_json(), model_path=prepared.model_path, golden=golden,
            bundle_dir=bundle_dir, cache_dir=folder / "cache", threads=self.threads,
            custom_op_libraries=prepared.libraries, custom_op_config=custom_ops.configuration(), policy=policy,
            cache=None, key="", percentile_calls=calls, cpu_cores=cores,
        )  # fmt: skip
        try:
            choice = choose(list(dict.fromkeys(manifest.providers)), found.availability, found.measurements, policy)
        except NoProviderError as err:
            return CandidateFigures(bundle_id=bundle_id, ok=False, error=str(err), threads=self.threads)
        chosen = found.measurements[choice.provider]
        pct = found.percentiles.get(choice.provider, {})
        return CandidateFigures(
            bundle_id=bundle_id, ok=True, provider=choice.provider, providers_measured=choice.medians_ms,
            p50_ms=pct.get("p50_ms"), p90_ms=pct.get("p90_ms"), p99_ms=pct.get("p99_ms"), load_ms=chosen.load_ms,
            peak_rss_mb=found.peak_rss_mb, golden_passed=chosen.golden.passed if chosen.golden else None,
            threads=self.threads,
        )  # fmt: skip
