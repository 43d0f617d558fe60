"""The conversion's time budget as a deadline that long work checks as it goes.

`--time-budget S` bounds the whole conversion, from the moment `convert` starts. The search stops starting builds
that would not fit (converter.search.attempts), and a build already running stops at the deadline: the work that
takes long calls `check()` between samples (ONNX Runtime's calibration reader, NNCF's calibration dataset and its
accuracy-control validation, the evaluation of a candidate, the per-layer ranking), so a build runs at most one
sample and one compile past it. What was built before the deadline is timed and chosen from as usual.

The float recipes (FP32, BF16, FP16) run outside any deadline: a conversion always has a float bundle. Like
converter.phases, the deadline lives in a context variable, so nothing has to be threaded through the libraries'
call stacks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from edgefleet.core.errors import ConversionError

__all__ = ["TimeBudgetSpent", "check", "until"]


class TimeBudgetSpent(ConversionError):
    """A build stopped because the conversion's time budget ran out (never cached: a later run may finish it)."""


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic()
    budget_s: float  # --time-budget, for the message


_current: ContextVar[_Deadline | None] = ContextVar("edgefleet_build_deadline", default=None)


@contextmanager
def until(at: float | None, budget_s: float) -> Iterator[None]:
    """Work in this context stops at `at` (time.monotonic()); None: no deadline."""
    token = _current.set(None if at is None else _Deadline(at, budget_s))
    try:
        yield
    finally:
        _current.reset(token)


def check() -> None:
    """Raise TimeBudgetSpent when the deadline of this context has passed; nothing when there is none."""
    current = _current.get()
    if current is not None and time.monotonic() > current.at:
        raise TimeBudgetSpent(
            f"stopped: the time budget ({current.budget_s:g} s) was spent before it finished (a larger "
            "--time-budget lets it finish)"
        )
