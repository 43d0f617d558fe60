"""Probe traffic: when live traffic is too thin to judge latency or errors, run the golden set at a bounded rate.

A quiet device (a canary nobody calls yet) would otherwise report no latency and no error figures, and a
rollout would have nothing to judge. The prober runs one golden sample every 1/rate seconds while fewer than
`min_live` live requests arrived in the last `idle_s` seconds, and stops as soon as live traffic is there.
Probe latencies feed the latency summary (so baselines and wave figures exist) and probe failures count
against health like live ones; telemetry says how many requests were probes (`probe_requests`). Probes are not
client requests: they are not counted in `requests`, and they feed neither drift, nor shadow, nor field accuracy.

A generative model is probed with a short greedy generation from its next golden prompt, while no generation of a
client runs: its time per output token feeds the latency summary (a generative model's request latency), its time
to first token and tokens the window's `GenerationStats` (`probe_streams`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgefleet.agent.runtime.generative import GenerativeModel, Retired
from edgefleet.agent.telemetry import GenerationWindow
from edgefleet.core.quality.golden import GoldenSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeConfig:
    rate: float = 2.0  # probe requests per second at most; 0 turns probing off
    min_live: int = 10  # live requests per `idle_s` below which the device counts as quiet
    idle_s: float = 10.0


class Probed(Protocol):
    """A served model (agent.runtime.LoadedModel); a generative one has `generative`, a GenerativeModel."""

    @property
    def golden(self) -> GoldenSet: ...

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class ProbeStats(Protocol):
    def live_within(self, seconds: float) -> int: ...

    def record_probe(self, latency_ms: float) -> None: ...

    def record_failure(self) -> None: ...

    @property
    def generation(self) -> GenerationWindow: ...


class Prober:
    def __init__(
        self,
        model: Callable[[], Probed | None],
        stats: ProbeStats,
        config: ProbeConfig,
        generation_stats: ProbeStats | None = None,
    ) -> None:
        """`stats`: the slot's request statistics; `generation_stats`: a generative model's (where its telemetry
        and health read token latency and generations), `stats` when None."""
        self._model, self._stats, self.config = model, stats, config
        self._generation_stats = generation_stats or stats
        self._stop = threading.Event()
        self._index = 0
        self._thread = threading.Thread(target=self._loop, name="probe", daemon=True)
        self._busy = threading.Condition()
        self._running: object | None = None  # the model a probe runs on now

    def start(self) -> Prober:
        if self.config.rate > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(1.0 / self.config.rate):
            try:
                self.probe_once()
            except Exception:  # probing must never take the agent down
                log.exception("probe failed")

    def wait_idle(self, model: object, timeout_s: float) -> bool:
        """True once no probe runs on `model`: a model a swap replaced is closed only then (its session closed under
        a probe in flight took the agent down: onnxruntime aborts the process)."""
        deadline = time.monotonic() + timeout_s
        with self._busy:
            while self._running is model:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._busy.wait(left)
        return True

    def probe_once(self) -> bool:
        """Run one golden sample when the device is quiet; True when it did."""
        with self._busy:  # the model and the mark that a probe runs on it, together: a swap sees one or the other
            model = self._running = self._model()
        try:
            return self._probe(model)
        finally:
            with self._busy:
                self._running = None
                self._busy.notify_all()

    def _probe(self, model: Probed | None) -> bool:
        if model is None or self._stats.live_within(self.config.idle_s) >= self.config.min_live:
            return False
        generative = getattr(model, "generative", None)
        if isinstance(generative, GenerativeModel):
            return self._probe_generation(generative)
        golden = model.golden.inputs
        feeds = golden.sample(self._index % len(golden))
        self._index += 1
        start = time.perf_counter()
        try:
            model.run(feeds)
        except Exception as err:  # the model failing on its own golden input is a health signal
            log.warning("probe request failed: %s", err)
            self._stats.record_failure()
            return True
        self._stats.record_probe((time.perf_counter() - start) * 1000)
        return True

    def _probe_generation(self, model: GenerativeModel) -> bool:
        if model.active:  # a client's generation runs: the device is not quiet
            return False
        stats = self._generation_stats
        try:
            result = model.probe()
        except Retired:
            return False
        except Exception as err:  # the model failing on its own golden prompt is a health signal
            log.warning("probe generation failed: %s", err)
            stats.record_failure()
            return True
        stats.generation.finished(
            result.prompt_tokens, len(result.tokens), result.ttft_ms, result.decode_ms, probe=True
        )
        if result.tpot_ms is not None:
            stats.record_probe(result.tpot_ms)
        return True
