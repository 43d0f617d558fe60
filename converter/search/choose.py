"""Choosing a recipe: a pure function of what was built and measured, and the profile's budget.

Keeps the fastest candidate inside the accuracy budget and the size limit, and says why every other candidate
lost. Candidates that could not be timed on this machine (their device is absent) are chosen by the profile's
preference order instead, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Candidate:
    """One recipe built (and, where the device is here, measured) on this machine.

    `error` is set when building or running it failed; `gate` when it ran but missed the accuracy budget.
    """

    name: str
    precision: str
    runtime: str
    size_bytes: int = 0
    accuracy: float | None = None
    latency_ms: float | None = None
    error: str | None = None
    rejected: str | None = None
    format: str = "onnx"
    provider: str = ""
    measured: bool = True
    gate: str | None = None
    sqnr_db: float | None = None
    max_abs: float | None = None
    p90_ms: float | None = None
    order: int = 0  # position in the profile's preference order (targets, then precisions)
    bar: float | None = None  # the floor on the data that judged it (None: the evaluation set's, `choose`'s)


@dataclass(frozen=True)
class Choice:
    chosen: Candidate | None
    rejected: list[Candidate]
    accuracy_floor: float


def choose(candidates: list[Candidate], *, reference: float, max_drop: float, size_limit_bytes: int) -> Choice:
    """The fastest measured candidate inside the budget; unmeasured ones win only when nothing was measured,
    and then by preference order."""
    floor = reference - max_drop
    eligible: list[Candidate] = []
    rejected: list[Candidate] = []
    for cand in candidates:
        own = floor if cand.bar is None else cand.bar  # judged on a held-out split: the bar on that split
        reason = _disqualification(cand, own, own + max_drop, max_drop, size_limit_bytes)
        if reason:
            rejected.append(replace(cand, rejected=reason))
        else:
            eligible.append(cand)
    if not eligible:
        return Choice(None, rejected, floor)
    measured = [c for c in eligible if c.measured and c.latency_ms is not None]
    if measured:
        measured.sort(key=lambda c: (c.latency_ms, c.size_bytes))
        best = measured[0]
        assert best.latency_ms is not None
        for cand in eligible:
            if cand is best:
                continue
            if cand.latency_ms is None:
                rejected.append(replace(cand, rejected=f"not measured on this machine; {best.name} was"))
                continue
            ratio = cand.latency_ms / best.latency_ms
            reason = (
                f"slower: {cand.latency_ms:.3f} ms median vs {best.latency_ms:.3f} ms for {best.name} ({ratio:.2f}x)"
            )
            rejected.append(replace(cand, rejected=reason))
        return Choice(best, rejected, floor)
    eligible.sort(key=lambda c: c.order)
    best = eligible[0]
    for cand in eligible[1:]:
        rejected.append(
            replace(cand, rejected=f"latency not measurable here; {best.name} comes first in the profile's order")
        )
    return Choice(best, rejected, floor)


def _disqualification(cand: Candidate, floor: float, reference: float, max_drop: float, size_limit: int) -> str:
    if cand.error:
        return cand.error if cand.error.startswith(("not suited", "pruned")) else f"failed: {cand.error}"
    if cand.accuracy is None:
        return "not measured"
    if cand.gate:
        return cand.gate
    if cand.measured and cand.latency_ms is None:
        return "not measured"
    if cand.accuracy < floor - 1e-12:
        return (
            f"accuracy {cand.accuracy:.4f} below the budget floor {floor:.4f} "
            f"(FP32 reference {reference:.4f} minus {max_drop:.4f})"
        )
    if cand.size_bytes > size_limit:
        return f"size {cand.size_bytes / 1e6:.3g} MB over the profile's limit {size_limit / 1e6:.3g} MB"
    return ""
