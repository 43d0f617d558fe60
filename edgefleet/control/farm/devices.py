"""Which devices measure a profile's candidates (`convert --measure-on DEVICE|GROUP`): a pure function of the
host registry (store), the devices' retained status and the profiles' lineage.

The name is a device id, else a group (a host-side group definition, or the agent-side `--group` of that name:
edgefleet/control/fleet/registry.py). Of those devices, a profile's candidates go to the ones that are online and
whose profile (the registry's, else the device's own report) satisfies the candidates' profile: the profile
itself or one that refines it (core/profiles.py `lineage`), as a device would accept the bundle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from edgefleet.control.fleet.registry import EmptyGroupError, host_view, require_members, revoked
from edgefleet.control.store import DeviceRecord, GroupDef
from edgefleet.core.errors import UserInputError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.profiles import profile_lineage


def merge_status(records: Sequence[DeviceRecord], statuses: Mapping[str, DeviceStatus]) -> list[DeviceRecord]:
    """The registry's records with what each device's retained status says now (online, its own report), plus the
    devices only the broker knows."""
    merged = {r.device_id: r for r in records}
    for device_id, status in statuses.items():
        known = merged.get(device_id)
        groups = tuple(status.groups)
        merged[device_id] = (
            replace(known, online=status.online, profile=status.profile, groups=groups)
            if known
            else DeviceRecord(device_id, status.online, status.state, status.profile, groups)
        )
    return [merged[d] for d in sorted(merged)]


def resolve_target(name: str, devices: Sequence[DeviceRecord], groups: Mapping[str, GroupDef]) -> list[DeviceRecord]:
    """The devices `name` stands for: the device of that id, else the members of that group."""
    for device in devices:
        if device.device_id == name and name not in groups:
            return [host_view(device)]
    try:
        return [host_view(d) for d in require_members(name, groups, devices)]
    except EmptyGroupError as err:
        raise UserInputError(f"--measure-on {name}: no device has that id, and {err}") from err


def for_profile(devices: Sequence[DeviceRecord], profile: str) -> tuple[list[str], list[str]]:
    """The online devices that run `profile`'s bundles, and a note for each device left out."""
    chosen, notes = [], []
    for device in devices:
        if device.profile is None or profile not in profile_lineage(device.profile):
            notes.append(f"{device.device_id} runs {device.profile or 'no known profile'}, not {profile}: not asked")
        elif revoked(device):  # `keys revoke-device`: its certificate must not read the candidates
            notes.append(f"{device.device_id} was revoked at {revoked(device)}: not asked")
        elif not device.online:
            notes.append(f"{device.device_id} is offline: not asked")
        else:
            chosen.append(device.device_id)
    return chosen, notes
