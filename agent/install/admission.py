"""Memory admission: a slot's bundle is fetched only if the device's desired set of models fits its memory.

Before a block of a slot's bundle is fetched (agent/install/installer.py, right after the signed offer checks out),
the slot asks `MemoryBudget.admit`: the set it would run — every other slot's model (held or being installed) plus
the newcomer — must fit in min(the profile's budget, the memory measured free now + what the slots' models hold).
A model's figure is its manifest's measured peak for the runtime (`resources.peak_mb`); a bundle whose manifest has
none counts twice the size of its files, and the reason says so. A set that does not fit refuses the newcomer with
the reason ("assistant needs 610 MB, 420 MB free after detector (budget 2048 MB)"); 0 bytes of it are fetched and
no serving slot is evicted to make room (tests/integration/agent/test_slots.py,
test_over_budget_slot_is_refused_before_any_block).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from edgefleet.agent.install.installer import Refused
from edgefleet.core.bundle.manifest import Manifest

MB = 1e6


class OverBudget(Refused):
    """The slot's bundle does not fit the device's memory beside the other slots; the message says why."""


def measured_free_mb() -> float:
    """The memory the system says is available to a new process allocation, in MB."""
    return float(psutil.virtual_memory().available) / MB


@dataclass(frozen=True)
class Need:
    mb: float
    basis: str  # "measured peak" or the stand-in's explanation


def need_of(manifest: Manifest) -> Need:
    """What the bundle's model needs loaded: its measured peak for its runtime, else twice its files' size."""
    if manifest.resources is not None and manifest.resources.peak_memory_mb:
        return Need(manifest.resources.peak_mb(), "measured peak")  # the largest runtime's: over, never under
    size = sum(entry.size for entry in manifest.files)
    return Need(2 * size / MB, "no measured peak in its manifest: twice its files' size")


class MemoryBudget:
    """The device's memory as the slots share it: what each slot's model holds (or is being installed with)."""

    def __init__(self, budget_mb: float, free_mb: Callable[[], float] = measured_free_mb) -> None:
        self.budget_mb, self._free_mb = budget_mb, free_mb
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}  # slot -> MB its model holds, or reserved for its install
        self.changes = 0  # counts every change of what the slots hold: a refused slot is worth retrying after one

    def free_mb(self) -> float:
        return self._free_mb()

    def admit(self, slot: str, manifest: Manifest) -> float:
        """Reserve `slot`'s room for `manifest`'s model (replacing what the slot held), or OverBudget with the
        reason. Returns the MB reserved."""
        need = need_of(manifest)
        with self._lock:
            others = {name: mb for name, mb in self._held.items() if name != slot}
            held = sum(self._held.values())
            free = self._free_mb()
            available = min(self.budget_mb, free + held)
            left = available - sum(others.values())
            if need.mb > left:
                after = ", ".join(f"{name} ({mb:.0f} MB)" for name, mb in sorted(others.items())) or "no other slot"
                limit = f"budget {self.budget_mb:.0f} MB" + (
                    f", {free:.0f} MB measured free" if free + held < self.budget_mb else ""
                )
                basis = "" if need.basis == "measured peak" else f"; {need.basis}"
                raise OverBudget(
                    f"{slot} needs {need.mb:.0f} MB, {max(left, 0):.0f} MB free after {after} ({limit}{basis}); "
                    "not downloaded, no serving slot evicted"
                )
            self._held[slot] = need.mb
            self.changes += 1
            return need.mb

    def hold(self, slot: str, manifest: Manifest | None) -> None:
        """`slot` runs `manifest`'s model now (None: nothing)."""
        with self._lock:
            before = self._held.get(slot)
            if manifest is None:
                self._held.pop(slot, None)
            else:
                self._held[slot] = need_of(manifest).mb
            if self._held.get(slot) != before:
                self.changes += 1


__all__ = ["MemoryBudget", "Need", "OverBudget", "measured_free_mb", "need_of"]
