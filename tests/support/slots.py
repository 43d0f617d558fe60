"""A device's slots as its retained status lists them (DeviceStatus.slots): the figures of one slot."""

from __future__ import annotations

from edgefleet.core.messages import DeviceStatus, SlotStatus
from edgefleet.core.topics import DEFAULT_SLOT


def slot_of(status: DeviceStatus | None, slot: str = DEFAULT_SLOT) -> SlotStatus:
    """Slot `slot` of the status; a slot the device does not list reads as one serving nothing (state idle)."""
    for entry in status.slots if status is not None else []:
        if entry.slot == slot:
            return entry
    return SlotStatus(slot=slot, state="idle")


__all__ = ["slot_of"]
