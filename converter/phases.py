"""Where a conversion's time goes, and what it is doing now: phase clocks and progress events.

The converter marks its phases (`with phase("quantize"):`) and reports progress (`step("timing", done, total)`);
both go to whatever is listening in this context (a bench's `recording()`, the CLI's progress bars) and cost
nothing when nobody is. Phases nest: time is charged to the innermost phase only, so the figures add up to the
wall time spent inside phases.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

PHASES = ("prepare", "export", "quantize", "calibration", "accuracy", "layer-report", "timing", "roofline")


@dataclass
class PhaseClock:
    """Exclusive wall seconds per phase, and how many times each was entered."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    _stack: list[tuple[str, float]] = field(default_factory=list)

    def enter(self, name: str) -> None:
        now = time.perf_counter()
        if self._stack:  # pause the enclosing phase
            outer, since = self._stack[-1]
            self.seconds[outer] = self.seconds.get(outer, 0.0) + now - since
        self._stack.append((name, now))
        self.counts[name] = self.counts.get(name, 0) + 1

    def leave(self) -> None:
        now = time.perf_counter()
        name, since = self._stack.pop()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - since
        if self._stack:  # resume the enclosing phase
            self._stack[-1] = (self._stack[-1][0], now)

    def total(self) -> float:
        return sum(self.seconds.values())


Listener = Callable[[str, int, int, str], None]  # phase, done, total (0 = unknown), what

_clock: ContextVar[PhaseClock | None] = ContextVar("edgefleet_phase_clock", default=None)
_listener: ContextVar[Listener | None] = ContextVar("edgefleet_progress_listener", default=None)


@contextmanager
def phase(name: str) -> Iterator[None]:
    clock = _clock.get()
    if clock is None:
        yield
        return
    clock.enter(name)
    try:
        yield
    finally:
        clock.leave()


def step(name: str, done: int, total: int = 0, what: str = "") -> None:
    """Progress within a phase: `done` of `total` items (0 when the total is not known yet)."""
    listener = _listener.get()
    if listener is not None:
        listener(name, done, total, what)


@contextmanager
def recording() -> Iterator[PhaseClock]:
    """Charge every phase entered in this context to a new clock."""
    clock = PhaseClock()
    token = _clock.set(clock)
    try:
        yield clock
    finally:
        _clock.reset(token)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)
