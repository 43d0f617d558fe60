"""Starting and commanding rollouts: the spec from an operator's input, the plan saved to the store, commands queued
for the engine (`rollout_engine` drives what is saved here)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from pydantic import ValidationError

from edgefleet.control.registry import require_members
from edgefleet.control.rollout import (
    ACTIVE_STATES,
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
from edgefleet.control.store import RolloutRow, Store
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.manifest import Manifest


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


def prepare_rollout(store: Store, spec: RolloutSpec, *, now: float | None = None) -> RolloutDoc:
    """Check the rollout against the registry, plan its waves and save it (state pending)."""
    now = time.time() if now is None else now
    devices = store.devices()
    if not devices:
        raise RolloutSpecError(
            f"the store {store.url} knows no device yet: is `edgefleet control serve` running on it?"
        )
    members = require_members(spec.group, store.groups(), devices)
    mismatched = [d for d in members if spec.bundle_for(d.profile) is None]
    if mismatched:
        listed = ", ".join(f"{d.device_id} ({d.profile or 'no profile'})" for d in mismatched[:10])
        more = f" and {len(mismatched) - 10} more" if len(mismatched) > 10 else ""
        raise RolloutSpecError(
            f"{len(mismatched)} device(s) of group {spec.group!r} have a profile no bundle is built for: "
            f"{listed}{more}; the bundles are for {', '.join(sorted(b.profile for b in spec.bundles))}"
        )
    wanted = {d.device_id for d in members}
    for row in store.rollouts(ACTIVE_STATES):
        other = load_doc(row)
        busy = sorted(wanted & set(other.devices))
        if busy:
            raise RolloutSpecError(
                f"rollout {other.id} ({other.state}) still holds {len(busy)} of these devices ({', '.join(busy[:5])}); "
                "let it finish or abort it first"
            )
    rollout_id = f"{spec.group}-v{spec.bundles[0].model_version}-{secrets.token_hex(3)}"
    ordered = order_devices([d.device_id for d in members], [d.online for d in members], rollout_id)
    plan = plan_waves(ordered, spec.canary, spec.waves)
    profiles = {d.device_id: d.profile for d in members}
    doc = RolloutDoc(
        id=rollout_id,
        spec=spec,
        created_at=now,
        updated_at=now,
        waves=[WaveProgress(index=i, devices=ids) for i, ids in enumerate(plan)],
        devices={
            device_id: DeviceProgress(device_id=device_id, profile=profiles[device_id], wave=i)
            for i, ids in enumerate(plan)
            for device_id in ids
        },
    )
    if spec.shadow is not None:
        doc.shadow = ShadowProgress(devices={d: ShadowDevice(device_id=d) for d in plan[0]})
    if spec.allow_unjudged:
        doc.note(now, f"the operator allows unjudged: {', '.join(spec.allow_unjudged)} (no data: passes, not fails)")
    doc.note(now, f"planned {len(members)} devices of {spec.group} in waves of {', '.join(str(len(w)) for w in plan)}")
    store.save_rollout(to_row(doc))
    return doc


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


__all__ = ["bundle_ref", "load_doc", "make_spec", "prepare_rollout", "request", "to_row"]
