"""The conversion's time budget as a deadline that long work checks as it goes.

`--time-budget S` bounds the whole conversion, from the moment `convert` starts. The search stops starting builds
that would not fit (converter.search.attempts), and a build already running stops at the deadline: the work that
takes long calls `check()` between samples (ONNX Runtime's calibration reader, NNCF's calibration dataset and its
accuracy-control validation, the evaluation of a candidate, the per-layer ranking), so a build runs at most one
sample and one compile past it. What was built before the deadline is timed and chosen from as usual.

Only the first FP32 candidate runs outside any deadline: a conversion always has a float bundle. Everything
else is sized to the time left, however slow the machine is: the FP32 reference is computed on as many evaluation
samples as fit a share of the budget (so every later evaluation costs about as much), BF16 and FP16 are builds
like any other, and the timing and the head to head shrink their rounds, or are skipped, to fit what is left
(converter.search.timing). Whatever the budget cut is recorded with `cut()` and listed in the report.

Like converter.phases, the deadline and the cuts live in context variables, so nothing has to be threaded
through the libraries' call stacks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from edgefleet.core.errors import ConversionError

__all__ = ["Cut", "TimeBudgetSpent", "check", "cut", "cuts", "recording_cuts", "remaining", "until"]


class TimeBudgetSpent(ConversionError):
    """A build stopped because the conversion's time budget ran out (never cached: a later run may finish it)."""


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic()
    budget_s: float  # --time-budget, for the message


_current: ContextVar[_Deadline | None] = ContextVar("edgefleet_build_deadline", default=None)


@dataclass(frozen=True)
class Cut:
    """One thing the time budget cut: `what` (a candidate, a recipe, the timing, the evaluation set) and how."""

    what: str
    how: str


_cuts: ContextVar[list[Cut] | None] = ContextVar("edgefleet_budget_cuts", default=None)


@contextmanager
def recording_cuts() -> Iterator[list[Cut]]:
    """Collect what `cut()` records in this context (the conversion's report lists it)."""
    found: list[Cut] = []
    token = _cuts.set(found)
    try:
        yield found
    finally:
        _cuts.reset(token)


def cut(what: str, how: str) -> None:
    """Record that the time budget cut `what`; nothing when nobody records (once per what and how)."""
    found = _cuts.get()
    if found is not None and Cut(what, how) not in found:
        found.append(Cut(what, how))


def cuts() -> list[Cut]:
    """What was cut so far in this context."""
    return list(_cuts.get() or [])


@contextmanager
def until(at: float | None, budget_s: float) -> Iterator[None]:
    """Work in this context stops at `at` (time.monotonic()); None: no deadline."""
    token = _current.set(None if at is None else _Deadline(at, budget_s))
    try:
        yield
    finally:
        _current.reset(token)


def remaining() -> float | None:
    """Seconds left before the deadline of this context (negative once it passed); None when there is none."""
    current = _current.get()
    return None if current is None else current.at - time.monotonic()


def check() -> None:
    """Raise TimeBudgetSpent when the deadline of this context has passed; nothing when there is none."""
    current = _current.get()
    if current is not None and time.monotonic() > current.at:
        raise TimeBudgetSpent(
            f"stopped: the time budget ({current.budget_s:g} s) was spent before it finished (a larger "
            "--time-budget lets it finish)"
        )
