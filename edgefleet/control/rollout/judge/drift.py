"""The drift criterion of a wave (optional; off unless the rollout sets `max_drift_psi`), a pure function like the
rest of `judge`.

The agent scores drift (PSI, agent/quality/drift.py) of each input and output over its sliding window of live traffic
against the reference statistics the bundle carries, and reports it in telemetry. With the criterion set, the new
bundle's worst score may be at most `max_drift_psi` once at least `min_drift_samples` live samples stand behind
every score. It never passes blind: no drift scores for the new bundle (a bundle without reference statistics, a
device with no traffic yet) or too few samples keeps the device pending, and when the wave's time is up it fails
with the reason, e.g. "no data for drift: no drift scores reported for the new bundle", unless the rollout was
started with `--allow-unjudged drift`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgefleet.control.rollout.judge.evidence import Finding, Metrics, Thresholds
from edgefleet.control.store import QualityPoint


def drift_figures(points: Sequence[QualityPoint]) -> dict[str, Any]:
    """Metrics fields from the latest report of a bundle (oldest first) that carries drift scores."""
    latest = next((p for p in reversed(points) if p.drift), None)
    if latest is None:
        return {}
    worst = max(latest.drift, key=lambda d: d.psi)
    return {
        "drift_psi": worst.psi,
        "drift_worst": f"{worst.kind} {worst.name}",
        "drift_samples": min(d.samples for d in latest.drift),
    }


def drift(observed: Metrics, t: Thresholds) -> Finding | None:
    limit = t.max_drift_psi
    if limit is None:
        return None
    if observed.drift_psi is None:
        return Finding(
            criterion="drift", ok=None, pending=True,
            detail="not judged: no drift scores reported for the new bundle (no reference statistics in the bundle, "
            "or no live traffic yet)",
        )  # fmt: skip
    if observed.drift_samples < t.min_drift_samples:
        return Finding(
            criterion="drift", ok=None, pending=True,
            detail=f"not judged: {observed.drift_samples} live samples behind the drift scores, "
            f"{t.min_drift_samples} needed",
        )  # fmt: skip
    ok = observed.drift_psi <= limit + 1e-9
    verb = "within" if ok else "exceeds"
    return Finding(
        criterion="drift", ok=ok,
        detail=f"worst drift PSI {observed.drift_psi:.3f} ({observed.drift_worst}) {verb} the limit {limit:g} over "
        f"{observed.drift_samples} live samples",
    )  # fmt: skip


__all__ = ["drift", "drift_figures"]
