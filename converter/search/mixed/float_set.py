"""How many of a quantized model's worst layers to keep in float: the fewest that meet the task bar, found with
few builds.

Layers come ranked worst first (ONNX Runtime's qdq_loss_debug SQNR per activation); keeping the k worst in
float is one build, confirmed by the task metric. The float set grows 1, 2, 4, 8, ... until a build meets the
bar (or every ranked layer is in float), then a binary search between the last count that missed and the first
that met narrows it to the smallest count that meets it: about 2·log2(n) builds for n ranked layers, not n.
The smallest passing float set keeps the most layers in INT8, so it is the variant kept; the larger passing
ones are reported and dropped. Pure: `try_count` builds and judges, this module only decides what to try.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Trial(Generic[T]):
    count: int  # worst layers kept in float
    result: T
    passed: bool


@dataclass
class FloatSearch(Generic[T]):
    trials: list[Trial[T]] = field(default_factory=list)  # in the order they were built
    best: Trial[T] | None = None  # the smallest float set that met the bar
    stopped: str = ""  # why the search ended early (time budget), else ""

    @property
    def failed(self) -> list[Trial[T]]:
        return [t for t in self.trials if t is not self.best]


def growth_counts(total: int, start: int = 1) -> list[int]:
    """1, 2, 4, ... capped at `total` (the last one is `total` itself)."""
    counts, k = [], max(1, start)
    while k < total:
        counts.append(k)
        k *= 2
    return [*counts, total] if total > 0 else []


def search_float_set(
    total: int,
    try_count: Callable[[int], tuple[T, bool]],
    out_of_time: Callable[[], bool] = lambda: False,
    start: int = 1,
) -> FloatSearch[T]:
    """The smallest k in 1..total for which `try_count(k)` passes, assuming more float layers never hurt.

    `try_count(k)` returns (what was built, whether it met the bar)."""
    found: FloatSearch[T] = FloatSearch()

    def attempt(k: int) -> bool:
        result, passed = try_count(k)
        trial = Trial(k, result, passed)
        found.trials.append(trial)
        if passed and (found.best is None or k < found.best.count):
            found.best = trial
        return passed

    low = 0  # largest count known to miss the bar
    for k in growth_counts(total, start):
        if attempt(k):
            break
        low = k
        if out_of_time():
            found.stopped = "time budget spent while growing the float set"
            return found
    if found.best is None:
        return found
    high = found.best.count
    while high - low > 1:
        if out_of_time():
            found.stopped = "time budget spent during the binary search"
            break
        middle = (low + high) // 2
        if attempt(middle):
            high = middle
        else:
            low = middle
    return found
