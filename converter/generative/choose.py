"""Choosing a profile's generative candidate: a pure function of what was judged and timed.

The fastest candidate by median TPOT among those inside the bars and timed here; candidates within `TIE` (10 %)
of the fastest are a tie on a shared machine (two timing runs on tinylm differed by up to 30 %), which the
profile's precision order breaks (then the smaller). When none inside the bars was timed (the profile's device is
not this host), the first in the profile's precision order, and the reason says so. Every other candidate gets its
reason.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TIE", "Decision", "Judged", "choose", "over_every_limit"]

TIE = 0.10


@dataclass(frozen=True)
class Judged:
    name: str
    order: int  # the profile's preference (targets, then precisions)
    refused: str | None  # why it cannot ship at all: a bar, the size limit, a failed build or run
    tpot_ms: float | None  # None: not timed here
    size_bytes: int


@dataclass(frozen=True)
class Decision:
    chosen: str | None
    reasons: dict[str, str]  # every other candidate: why not
    how: str  # how the chosen one won


def choose(candidates: list[Judged]) -> Decision:
    reasons = {c.name: c.refused for c in candidates if c.refused}
    eligible = [c for c in candidates if not c.refused]
    if not eligible:
        return Decision(None, reasons, "no candidate passed")
    timed = [c for c in eligible if c.tpot_ms is not None]
    if timed:
        fastest = min(c.tpot_ms for c in timed if c.tpot_ms is not None)
        tied = sorted((c for c in timed if c.tpot_ms is not None and c.tpot_ms <= fastest * (1 + TIE)),
                      key=lambda c: (c.order, c.size_bytes))  # fmt: skip
        best = tied[0]
        assert best.tpot_ms is not None
        for cand in eligible:
            if cand is best:
                continue
            if cand.tpot_ms is None:
                reasons[cand.name] = f"not timed on this host; {best.name} was and passes"
            elif cand in tied:
                reasons[cand.name] = (
                    f"as fast (TPOT {cand.tpot_ms:.4f} ms vs {best.tpot_ms:.4f} ms, within {TIE:.0%}): "
                    f"{best.name} comes first in the profile's precision order"
                )
            else:
                reasons[cand.name] = (
                    f"slower: TPOT {cand.tpot_ms:.4f} ms vs {best.tpot_ms:.4f} ms for {best.name} "
                    f"({cand.tpot_ms / best.tpot_ms:.2f}x)"
                )
        how = f"the fastest inside the bars: TPOT {best.tpot_ms:.4f} ms"
        if len(tied) > 1:
            how += f" ({len(tied)} within {TIE:.0%} of the fastest, {fastest:.4f} ms: the first in the profile's order)"
        return Decision(best.name, reasons, how)
    ordered = sorted(eligible, key=lambda c: (c.order, c.size_bytes))
    best = ordered[0]
    for cand in ordered[1:]:
        reasons[cand.name] = f"after {best.name} in the profile's precision order (nothing inside the bars was timed)"
    return Decision(best.name, reasons, "the profile's precision order: its device is not on this host, so not timed")


def over_every_limit(sizes: dict[str, int], limits_mb: dict[str, list[float]]) -> dict[str, str]:
    """The candidates (by name: their artifact's bytes) over the size limit of every profile that plans them (by
    name: those profiles' limits in MB), each with its refusal: they can ship nowhere, so they need not be judged or
    timed. One under any of its profiles' limits is kept; each profile refuses what is over its own later."""
    refused = {}
    for name, size in sizes.items():
        limits = limits_mb.get(name)
        if limits and size / 1e6 > max(limits):
            refused[name] = f"{size / 1e6:.1f} MB is over the profile's {max(limits):g} MB: not judged or timed"
    return refused
