"""Which devices a rollout targets, and where each may go back to: the host's own records decide, never a report.

Everything a device says about itself (its groups, its profile, the bundle it claims to run) is its word, and one
device certificate can say anything. So:

- **Membership and profile** are the registry's: a device is planned into a rollout only when it is enrolled
  (`edgefleet devices enroll ID --profile P --group G`), not revoked, has a registry profile, and belongs to the
  group by a host record (enrolled into it, listed in the host-side group, or matched by its selector). A device
  that merely reports the group is left out with the reason, and the planner says so (`Targets.left_out`). Where a
  member's report disagrees with the registry, the difference is a warning beside it (`Targets.warnings`).
- **A rollback target** is a bundle the store's publish history knows AND that the device is recorded as having
  committed (a `committed` event the store holds for that device and that bundle), built for a profile the
  device's registry profile runs. Its id, model name and version are copied from the store's record: no string a
  device made up ever reaches a signed desired document. A device whose claimed bundle fails any of these has no
  rollback target; the rollout does not send it anywhere but says why (`RollbackTarget.reason`).

Pure functions over records the engine and the planner read from the store, tested with tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgefleet.control.fleet.registry import enrolled, group_members, host_view, registry_warnings, revoked
from edgefleet.control.store import BundleRecord, DeviceRecord, GroupDef
from edgefleet.core.profiles import profile_lineage
from edgefleet.core.untrusted import safe_text


@dataclass(frozen=True)
class Targets:
    """A group's devices as the host's records have them."""

    members: list[DeviceRecord]  # host view: the registry's profile and groups
    left_out: dict[str, str] = field(default_factory=dict)  # device id → why it is not planned
    warnings: dict[str, list[str]] = field(default_factory=dict)  # member → where its report disagrees


def plan_targets(name: str, groups: Mapping[str, GroupDef], devices: Sequence[DeviceRecord]) -> Targets:
    """The devices a rollout to group `name` may plan: members by host records, with a registry profile."""
    candidates = {d.device_id: d for d in group_members(name, groups, devices)}
    listed = set(groups[name].devices) if name in groups else set()
    members: list[DeviceRecord] = []
    left_out: dict[str, str] = {}
    warnings: dict[str, list[str]] = {}
    for device in devices:
        view = host_view(device)
        claims = name in device.groups  # the device's own report
        if revoked(device):
            if device.device_id in candidates or claims:
                left_out[device.device_id] = f"revoked at {revoked(device)}"
            continue
        if not enrolled(device):
            if device.device_id in candidates or claims:
                how = "is listed in" if device.device_id in listed else "reports"
                left_out[device.device_id] = (
                    f"not enrolled: {how} group {safe_text(name, 64)}, but its profile and groups would be its own "
                    "word (`edgefleet devices enroll`)"
                )
            continue
        if device.device_id not in candidates:
            if claims:
                left_out[device.device_id] = (
                    f"reports group {safe_text(name, 64)}, the registry says {','.join(view.groups) or '(none)'}"
                )
            continue
        if view.profile is None:
            left_out[device.device_id] = "enrolled without a profile: no bundle can be chosen for it"
            continue
        members.append(view)
        disagree = registry_warnings(device)
        if disagree:
            warnings[device.device_id] = disagree
    return Targets(members, left_out, warnings)


def group_choices(groups: Mapping[str, GroupDef], devices: Sequence[DeviceRecord]) -> list[str]:
    """Group names a rollout may be started on: the host-side groups and the groups devices are enrolled into.
    A group only devices' own reports name is not one of them."""
    names = set(groups)
    for device in devices:
        if enrolled(device) and not revoked(device):
            names.update(host_view(device).groups)
    return sorted(names)


@dataclass(frozen=True)
class RollbackTarget:
    """Where a device goes back to when its rollout rolls back: `bundle` (the store's record), or None and why."""

    bundle: BundleRecord | None
    reason: str = ""


def rollback_target(
    claimed: str | None, profile: str | None, published: BundleRecord | None, committed: bool
) -> RollbackTarget:
    """The rollback target for a device that claims to run `claimed` (its report), given the store's record of
    that bundle (`published`, None when the store never published it) and whether the store holds a
    `committed` event from this device for it. `profile` is the device's registry profile."""
    if claimed is None:
        return RollbackTarget(None, "ran no bundle before the rollout, so there is nothing to return to")
    shown = safe_text(claimed, 80)
    if published is None or published.bundle_id != claimed:
        return RollbackTarget(None, f"reports running {shown}, which the store never published")
    if not committed:
        return RollbackTarget(None, f"reports running {shown}, but the store holds no commit of it from this device")
    if profile is None or published.profile not in profile_lineage(profile):
        return RollbackTarget(
            None, f"reports running {shown}, built for {published.profile}, which its registry profile "
            f"{profile or '(none)'} does not run",
        )  # fmt: skip
    return RollbackTarget(published)


__all__ = ["RollbackTarget", "Targets", "group_choices", "plan_targets", "rollback_target"]
