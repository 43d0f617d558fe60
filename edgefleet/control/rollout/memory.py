"""Planning admission by memory (issue 33, item 3): a rollout whose bundle would not fit a device of the group is
refused when it is planned, before anything is published.

For each device the rollout would reach, the new bundle of the rolled-out slot joins the bundles the device's other
slots run now (its status's word on each slot's active bundle); each counts the memory the host recorded for it at
publish (`BundleFacts.memory_mb`: the converter's measured peak for its runtime, or its files × 2 when the bundle
was built before peaks were measured, which the reason says). Their sum must fit the device profile's
`memory_budget_mb`. The reason reads as the device's own refusal does ("assistant needs 610 MB, 420 MB free after
detector (budget 2048 MB)"). A bundle the host has no record of counts nothing, and the reason says so when it
matters; the device still admits on its own measurement before any download.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.store import DeviceRecord


@dataclass(frozen=True)
class Need:
    """What one slot's bundle needs: MB, and whether the figure was measured (else its files × 2)."""

    slot: str
    bundle_id: str
    mb: float
    measured: bool


def need_of(slot: str, bundle_id: str, facts: BundleFacts | None) -> Need | None:
    if facts is None:
        return None
    mb, measured = facts.memory_mb()
    return Need(slot, bundle_id, mb, measured)


def memory_refusal(
    device: DeviceRecord,
    slot: str,
    bundle_id: str,
    budget_mb: float,
    facts: Callable[[str], BundleFacts | None],
) -> str | None:
    """Why `bundle_id` in `slot` does not fit `device` beside its other slots (None: it fits, or the host cannot
    tell: it has no record of the new bundle)."""
    new = need_of(slot, bundle_id, facts(bundle_id))
    if new is None:
        return None
    others = [
        need_of(s.slot, s.active_bundle, facts(s.active_bundle))
        for s in device.slots
        if s.slot != slot and s.active_bundle and s.state != "offline"
    ]
    held = [n for n in others if n is not None]
    free = budget_mb - sum(n.mb for n in held)
    if new.mb <= free:
        return None
    after = f" after {', '.join(n.slot for n in held)}" if held else ""
    reason = f"{slot} needs {new.mb:.0f} MB, {max(free, 0):.0f} MB free{after} (budget {budget_mb:.0f} MB)"
    estimated = [n.slot for n in (new, *held) if not n.measured]
    if estimated:
        reason += f"; {', '.join(estimated)} counted as files × 2 (no measured peak in the manifest)"
    return reason


__all__ = ["Need", "memory_refusal", "need_of"]
