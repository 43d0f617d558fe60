"""The neighbour guardrail (issue 33, contract item 9): a new version of one slot must not starve the device's
other slots.

During a rollout of slot A, another slot B of the same device that declares a latency objective
(`SlotStatus.latency_objective_ms`, from its desired document) is judged on its own reports: when B's p95 stays
above the objective after A's new bundle was installed, while it was inside the objective before, the new version
of A is what pushed it out, and A's rollout rolls back with the reason ("slot detector p95 41 ms > objective 30 ms
since assistant v2 arrived"). A neighbour with no reports before the install, or too few after it, is not judged:
there is nothing to compare. The figure judged is the median of the reports' p95s, so a single slow window does
not roll a rollout back.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from edgefleet.control.store import TelemetryPoint


def _median_p95(points: Sequence[TelemetryPoint]) -> float | None:
    values = [p.p95_ms for p in points if p.p95_ms is not None]
    return statistics.median(values) if values else None


def neighbour_breach(
    neighbour: str,
    objective_ms: float,
    before: Sequence[TelemetryPoint],
    after: Sequence[TelemetryPoint],
    arrived: str,
    *,
    min_reports: int = 1,
) -> str | None:
    """Why the new version (`arrived`, e.g. "assistant v2") is rolled back for pushing slot `neighbour` outside
    its p95 objective, or None when it did not (or when the neighbour's reports cannot tell)."""
    was = _median_p95(before)
    measured = [p for p in after if p.p95_ms is not None]
    now = _median_p95(measured)
    if was is None or now is None or len(measured) < min_reports:
        return None
    if was <= objective_ms < now:
        return f"slot {neighbour} p95 {now:.0f} ms > objective {objective_ms:.0f} ms since {arrived} arrived"
    return None


__all__ = ["neighbour_breach"]
