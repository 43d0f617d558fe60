"""The compute gate: who may start a step of compute now, by class (issue 33, item 5).

Each slot declares a class (the core's `Desired.slot_class`):
- `real-time` (a latency objective, e.g. a detector at a fixed rate) starts at once: it never waits behind
  interactive or batch work. At most the steps already running when it arrives (one per worker: a token, a run)
  overlap it, because no lower-class step starts while real-time work runs or waits.
- `interactive` (e.g. a language model streaming to a user) takes one step at a time (a generated token, a run) and
  yields between steps whenever real-time work waits or runs.
- `batch` runs only in what is left: when no real-time or interactive work waits or runs beyond the lanes.

`lanes` is how many steps of interactive and batch work may run at once (the device's cores as the manager
partitions them); real-time work runs beside them. The decision is the pure function `may_start`, tested by table
(tests/unit/agent/test_compute_gate.py). Every step is counted per slot: time waiting for its turn (queue), time
computing, and the yields (`SlotTimer`, shaped like core's `SlotTiming`). Waiting blocks on a condition: no spinning.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

from edgefleet.agent.schedule.timing import SlotTimer, TimingWindow

SlotClass = Literal["real-time", "interactive", "batch"]
CLASSES: tuple[SlotClass, ...] = get_args(SlotClass)


@dataclass
class Load:
    """What the gate holds now: steps running and waiting, per class."""

    running: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))


def may_start(slot_class: SlotClass, load: Load, lanes: int) -> bool:
    """Whether a step of `slot_class` may start now (`load` counts the step itself as waiting)."""
    if slot_class == "real-time":
        return True
    if load.running["real-time"] or load.waiting["real-time"]:
        return False
    lower = load.running["interactive"] + load.running["batch"]
    if lower >= lanes:
        return False
    if slot_class == "batch":
        return not load.waiting["interactive"]
    return True


def must_yield(slot_class: SlotClass, load: Load) -> bool:
    """Whether a step waiting now waits because of real-time work (a yield, counted)."""
    return slot_class != "real-time" and bool(load.running["real-time"] or load.waiting["real-time"])


class ComputeGate:
    """Orders steps of compute across slots by class. `step(slot)` is a context manager around one step (one
    inference run, one batch, one generated token) of the class `assign` gave the slot (interactive by default).
    `timing()` reads each slot's account."""

    def __init__(self, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, not {lanes}")
        self.lanes = lanes
        self._cond = threading.Condition(threading.Lock())
        self._load = Load()
        self._timers: dict[str, SlotTimer] = {}
        self._classes: dict[str, SlotClass] = {}

    def assign(self, slot: str, slot_class: SlotClass) -> None:
        """The class of `slot`'s steps from now on (the slot's desired state or bundle says it)."""
        if slot_class not in CLASSES:
            raise ValueError(f"unknown slot class {slot_class!r} (classes: {', '.join(CLASSES)})")
        with self._cond:
            self._classes[slot] = slot_class

    def class_of(self, slot: str) -> SlotClass:
        """The class assigned to `slot`; interactive when none was."""
        return self._classes.get(slot, "interactive")

    def timer(self, slot: str) -> SlotTimer:
        with self._cond:
            return self._timers.setdefault(slot, SlotTimer())

    @contextmanager
    def step(self, slot: str, slot_class: SlotClass | None = None) -> Iterator[None]:
        """One step of `slot`'s compute, of `slot_class` (default: the class assigned to the slot)."""
        slot_class = slot_class or self.class_of(slot)
        if slot_class not in CLASSES:
            raise ValueError(f"unknown slot class {slot_class!r} (classes: {', '.join(CLASSES)})")
        timer = self.timer(slot)
        queued = time.perf_counter()
        load = self._load
        with self._cond:
            load.waiting[slot_class] += 1
            yielded = False
            while not may_start(slot_class, load, self.lanes):
                yielded = yielded or must_yield(slot_class, load)
                self._cond.wait()
            load.waiting[slot_class] -= 1
            load.running[slot_class] += 1
        start = time.perf_counter()
        if yielded:
            timer.yielded()
        timer.queued((start - queued) * 1000)
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._cond:
                load.running[slot_class] -= 1
                self._cond.notify_all()
            timer.ran((end - start) * 1000)

    def snapshot(self) -> Load:
        with self._cond:
            return Load(dict(self._load.running), dict(self._load.waiting))

    def window(self, slot: str) -> TimingWindow | None:
        """`slot`'s queue and compute time since its last window (a telemetry report's), starting a new one; None
        when the slot never took a step."""
        with self._cond:
            timer = self._timers.get(slot)
        return timer.window() if timer is not None else None

    def timing(self, window: bool = False) -> dict[str, TimingWindow]:
        """Each slot's queue and compute time, steps and yields (since the last window when `window`)."""
        with self._cond:
            timers = dict(self._timers)
        return {slot: (t.window() if window else t.total()) for slot, t in timers.items()}


__all__ = ["CLASSES", "ComputeGate", "Load", "SlotClass", "may_start", "must_yield"]
