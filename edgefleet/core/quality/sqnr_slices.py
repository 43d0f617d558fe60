"""SQNR judged by slices: the lowest signal-to-quantization-noise ratio (dB) over every float output and, inside
each output, over the groups of channels whose scales differ.

An SQNR over a whole tensor only sees its largest values: a detection head concatenating box coordinates
(0–320) with class scores (0–1) scores 30 dB with its scores destroyed. So each output is cut along the axis
whose per-index RMS spreads the most (when it spreads by 10× or more), the indices are grouped by decade of
RMS, and every group is scored on its own. The worst slice decides; `slice_report` names it.

Shared by the converter's `sqnr-db` metric and the device's golden check (edgefleet/core/quality/task_rule.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.core.quality.output_rules import SQNR_CAP_DB, sqnr_db  # one SQNR, the converter's and the device's

SPREAD = 10.0  # RMS ratio between an axis' loudest and quietest index that makes it worth slicing
MAX_AXIS = 4096


@dataclass(frozen=True)
class Slice:
    output: str
    axis: int | None  # None: the whole output
    indices: tuple[int, ...]
    sqnr_db: float

    def describe(self) -> str:
        if self.axis is None:
            return f"{self.output}"
        lo, hi = min(self.indices), max(self.indices)
        span = f"{lo}" if lo == hi else f"{lo}..{hi}" + ("" if hi - lo + 1 == len(self.indices) else " (some)")
        return f"{self.output}[axis {self.axis}: {span}]"


def groups(want: np.ndarray) -> tuple[int | None, list[np.ndarray]]:
    """The axis to slice (None when no axis spreads) and the index groups along it (one decade of RMS each)."""
    best_axis, best_spread, best_rms = None, SPREAD, np.empty(0)
    values = want.astype(np.float64)
    for axis in range(1, values.ndim):
        size = values.shape[axis]
        if not 2 <= size <= MAX_AXIS:
            continue
        other = tuple(a for a in range(values.ndim) if a != axis)
        rms = np.sqrt(np.mean(values**2, axis=other))
        live = rms[rms > 0]
        if len(live) < 2:
            continue
        spread = float(live.max() / live.min())
        if spread >= best_spread:
            best_axis, best_spread, best_rms = axis, spread, rms
    if best_axis is None:
        return None, []
    decade = np.full(best_rms.shape, np.nan)
    live = best_rms > 0
    decade[live] = np.floor(np.log10(best_rms[live]))
    return best_axis, [np.flatnonzero(decade == d) for d in np.unique(decade[live])]


def slice_report(candidate: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[Slice]:
    """Every slice of every float output with its SQNR, worst first."""
    found: list[Slice] = []
    for name, want in reference.items():
        if not np.issubdtype(want.dtype, np.floating):
            continue
        got = candidate.get(name)
        if got is None or got.shape != want.shape:
            found.append(Slice(name, None, (), -SQNR_CAP_DB))
            continue
        found.append(Slice(name, None, (), sqnr_db(got, want)))
        axis, index_groups = groups(want)
        if axis is None:
            continue
        for indices in index_groups:
            part = (slice(None),) * axis + (indices,)
            found.append(Slice(name, axis, tuple(int(i) for i in indices), sqnr_db(got[part], want[part])))
    return sorted(found, key=lambda s: s.sqnr_db)


def worst_sqnr(candidate: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    report = slice_report(candidate, reference)
    return report[0].sqnr_db if report else SQNR_CAP_DB
