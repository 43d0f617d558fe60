"""Bounded generation: at most `concurrency` generations run at once and `queue` more wait; the rest are refused at
once (503). Shared by the local API and MQTT, so the device's bound holds whatever the path."""

from __future__ import annotations

import threading

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.config import GenerationConfig


class GenerationGate:
    def __init__(self, config: GenerationConfig) -> None:
        self.config = config
        self._places = threading.BoundedSemaphore(config.concurrency)
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return self._admitted - self._running

    def enter(self) -> GatePass:
        """A place among the admitted generations; RequestError 503 when running and waiting are full."""
        with self._lock:
            if self._admitted >= self.config.capacity:
                raise RequestError(
                    503, "overloaded", f"{self.config.concurrency} generations running and {self.config.queue} "
                    "waiting: retry later",
                )  # fmt: skip
            self._admitted += 1
        return GatePass(self)

    def _acquire(self, timeout_s: float) -> bool:
        if not self._places.acquire(timeout=timeout_s):
            return False
        with self._lock:
            self._running += 1
        return True

    def _leave(self, running: bool) -> None:
        with self._lock:
            self._admitted -= 1
            if running:
                self._running -= 1
        if running:
            self._places.release()


class GatePass:
    """One admitted generation: `wait` for a place, `release` once (any further call does nothing). A streamed answer
    `hold`s the pass past the request handler, and releases it when the stream ends."""

    def __init__(self, gate: GenerationGate) -> None:
        self._gate = gate
        self._running = self._released = self._held = False
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Take a generation place (waiting up to the queue timeout); RequestError 503 when none came."""
        if self._running:
            return
        if not self._gate._acquire(self._gate.config.queue_timeout_s):
            raise RequestError(503, "timeout", f"no generation place within {self._gate.config.queue_timeout_s:g} s")
        self._running = True

    def hold(self) -> None:
        self._held = True

    def release(self, *, final: bool = False) -> None:
        """Give the place back (a held pass only with `final`)."""
        with self._lock:
            if self._released or (self._held and not final):
                return
            self._released = True
        self._gate._leave(self._running)


__all__ = ["GatePass", "GenerationGate"]
