"""Starting and commanding rollouts: the spec from an operator's input, the plan saved to the store, commands queued
for the engine (`rollout_engine` drives what is saved here)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from edgefleet.control.fleet.registry import EmptyGroupError
from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.memory import memory_refusal
from edgefleet.control.rollout.plan import (
    BundleRef,
    DeviceProgress,
    RolloutDoc,
    RolloutSpec,
    RolloutSpecError,
    ShadowDevice,
    ShadowProgress,
    WaveProgress,
    order_devices,
    plan_waves,
)
from edgefleet.control.rollout.targets import Targets, group_choices, plan_targets
from edgefleet.control.store import DeviceRecord, RolloutRow, Store
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.profiles import get_profile
from edgefleet.core.untrusted import safe_text


def make_spec(**fields: Any) -> RolloutSpec:
    """A RolloutSpec, or a RolloutSpecError that says every problem in one line."""
    try:
        return RolloutSpec(**fields)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            where = ".".join(map(str, error["loc"]))
            problems.append(f"{where}: {message}" if where else message)
        raise RolloutSpecError("invalid rollout: " + "; ".join(problems)) from err


def bundle_ref(manifest: Manifest) -> BundleRef:
    return BundleRef(
        bundle_id=manifest.bundle_id,
        model_name=manifest.model_name,
        model_version=manifest.model_version,
        profile=manifest.profile,
        accuracy_budget=manifest.accuracy.budget,
    )


def to_row(doc: RolloutDoc) -> RolloutRow:
    return RolloutRow(doc.id, doc.state, doc.model_dump_json(), doc.created_at, doc.updated_at)


def load_doc(row: RolloutRow) -> RolloutDoc:
    return RolloutDoc.model_validate_json(row.doc)


def memory_refusals(store: Store, spec: RolloutSpec, members: Sequence[DeviceRecord]) -> list[tuple[str, str]]:
    """(device, why) for each member whose other slots leave too little of its profile's memory budget for the
    rollout's bundle (memory.py)."""
    cache: dict[str, BundleFacts | None] = {}

    def facts(bundle_id: str) -> BundleFacts | None:
        if bundle_id not in cache:
            text = store.bundle_facts(bundle_id)
            try:
                cache[bundle_id] = BundleFacts.model_validate_json(text) if text else None
            except ValidationError:  # written by another version: as if there were none
                cache[bundle_id] = None
        return cache[bundle_id]

    refusals = []
    for device in members:
        bundle = spec.bundle_for(device.profile)
        if bundle is None or device.profile is None:
            continue
        try:
            budget = get_profile(device.profile).memory_budget_mb
        except UserInputError:
            continue  # a profile this host does not know: planning said so already
        why = memory_refusal(device, spec.slot, bundle.bundle_id, budget, facts)
        if why is not None:
            refusals.append((device.device_id, why))
    return refusals


def prepare_rollout(store: Store, spec: RolloutSpec, *, now: float | None = None) -> RolloutDoc:
    """Check the rollout against the host's records, plan its waves and save it (state pending).

    Only devices the registry has in the group are planned (`targets.plan_targets`); devices that merely claim it
    are named in the plan with the reason, and a member that refused or rolled back this version before is
    warned about."""
    now = time.time() if now is None else now
    targets = rollout_targets(store, spec.group)
    members = targets.members
    agent = spec.agent_release  # an agent release fits every profile; its devices are judged on what they serve
    mismatched = [] if agent else [d for d in members if spec.bundle_for(d.profile) is None]
    if mismatched:
        listed = ", ".join(f"{d.device_id} ({d.profile or 'no profile'})" for d in mismatched[:10])
        more = f" and {len(mismatched) - 10} more" if len(mismatched) > 10 else ""
        raise RolloutSpecError(
            f"{len(mismatched)} device(s) of group {spec.group!r} have a profile no bundle is built for: "
            f"{listed}{more}; the bundles are for {', '.join(sorted(b.profile for b in spec.bundles))}"
        )
    refusals = [] if agent else memory_refusals(store, spec, members)
    if refusals:
        listed = "; ".join(f"{device}: {why}" for device, why in refusals[:5])
        more = f" and {len(refusals) - 5} more" if len(refusals) > 5 else ""
        raise RolloutSpecError(
            f"{len(refusals)} device(s) of group {spec.group!r} cannot hold the bundle in slot {spec.slot!r}: "
            f"{listed}{more}"
        )
    wanted = {d.device_id for d in members}
    history = [load_doc(row) for row in store.rollouts()]
    for other in history:
        # Another slot's rollout may run beside this one (the neighbour guardrail watches the pair); an agent release
        # changes what serves every slot, so it runs beside no other rollout of its devices.
        clash = other.spec.slot == spec.slot or agent is not None or other.spec.agent_release is not None
        busy = sorted(wanted & set(other.devices)) if other.active and clash else []
        if busy:
            raise RolloutSpecError(
                f"rollout {other.id} ({other.state}) still holds {len(busy)} of these devices ({', '.join(busy[:5])}); "
                "let it finish or abort it first"
            )
    version = f"agent-v{agent.version}" if agent else f"v{spec.bundles[0].model_version}"
    rollout_id = f"{spec.group}-{version}-{secrets.token_hex(3)}"
    ordered = order_devices([d.device_id for d in members], [d.online for d in members], rollout_id)
    plan = plan_waves(ordered, spec.canary, spec.waves)
    profiles = {d.device_id: d.profile for d in members}
    refused = {} if agent else refused_before(history, spec)
    doc = RolloutDoc(
        id=rollout_id,
        spec=spec,
        created_at=now,
        updated_at=now,
        waves=[WaveProgress(index=i, devices=ids) for i, ids in enumerate(plan)],
        devices={
            device_id: DeviceProgress(
                device_id=device_id, profile=profiles[device_id], wave=i,
                warnings=[*targets.warnings.get(device_id, []), *refused.get(device_id, [])],
            )
            for i, ids in enumerate(plan)
            for device_id in ids
        },
        left_out=targets.left_out,
    )  # fmt: skip
    if spec.shadow is not None:
        doc.shadow = ShadowProgress(devices={d: ShadowDevice(device_id=d) for d in plan[0]})
    if spec.allow_unjudged:
        doc.note(now, f"the operator allows unjudged: {', '.join(spec.allow_unjudged)} (no data: passes, not fails)")
    waves = ", ".join(str(len(w)) for w in plan)
    what = f"agent release {agent.release_id} (judged on slot {spec.slot})" if agent else f"slot {spec.slot}"
    doc.note(now, f"planned {what} of {len(members)} devices of {spec.group} in waves of {waves}")
    if targets.left_out:
        doc.note(now, f"left out {len(targets.left_out)} device(s) the host's records do not put in {spec.group}: "
                 + "; ".join(f"{d}: {r}" for d, r in sorted(targets.left_out.items())[:5]))  # fmt: skip
    for device_id, warnings in sorted(refused.items()):
        doc.note(now, f"warning: {device_id} {warnings[0]}")
    store.save_rollout(to_row(doc))
    return doc


def rollout_targets(store: Store, group: str) -> Targets:
    """The devices a rollout to `group` plans, by host records; EmptyGroupError when there are none."""
    devices = store.devices()
    if not devices:
        raise RolloutSpecError(
            f"the store {store.url} knows no device yet: is `edgefleet control serve` running on it?"
        )
    targets = plan_targets(group, store.groups(), devices)
    if not targets.members:
        why = "; ".join(f"{d}: {r}" for d, r in sorted(targets.left_out.items())[:5])
        known = ", ".join(group_choices(store.groups(), devices)) or "(none)"
        raise EmptyGroupError(
            f"group {group!r} has no devices by the host's records"
            + (f" ({why})" if why else "")
            + f"; enroll devices with `edgefleet devices enroll ID --profile P --group {group}`; groups: {known}"
        )
    return targets


def refused_before(history: list[RolloutDoc], spec: RolloutSpec) -> dict[str, list[str]]:
    """device id → a warning for each earlier rollout of this model version it refused or failed."""
    version = (spec.bundles[0].model_name, spec.bundles[0].model_version)
    found: dict[str, list[str]] = {}
    for other in sorted(history, key=lambda d: d.created_at):
        if not other.spec.bundles:
            continue  # an agent-release rollout
        first = other.spec.bundles[0]
        if (first.model_name, first.model_version) != version:
            continue
        for progress in other.devices.values():
            why = progress.reason.split(";")[0]
            if progress.state == "refused" or why.startswith(("refused:", "rolled-back:", "health-failed:")):
                found.setdefault(progress.device_id, []).append(
                    f"refused {version[0]} {version[1]} in rollout {other.id}: {safe_text(why, 160)}"
                )
            elif progress.state in ("failed", "timed-out") or (progress.state == "rolled-back" and why):
                found.setdefault(progress.device_id, []).append(
                    f"failed {version[0]} {version[1]} in rollout {other.id} ({progress.state}): {safe_text(why, 160)}"
                )
    return found


def request(store: Store, rollout_id: str, command: str) -> RolloutDoc:
    """Queue pause/resume/abort for the engine; the rollout as it stands now."""
    row = store.rollout(rollout_id)
    if row is None:
        raise UnknownNameError("rollout", rollout_id, [r.id for r in store.rollouts()])
    doc = load_doc(row)
    if not doc.active:
        raise RolloutSpecError(f"rollout {rollout_id} has ended ({doc.state}); nothing to {command}")
    store.set_command(rollout_id, command)
    return doc


__all__ = [
    "bundle_ref",
    "load_doc",
    "make_spec",
    "prepare_rollout",
    "refused_before",
    "request",
    "rollout_targets",
    "to_row",
]
