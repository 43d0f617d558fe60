"""How a rollout ends: the new bundles become the group's deployment, or every device it touched goes back."""

from __future__ import annotations

from edgefleet.control.desired import plan_desired
from edgefleet.control.rollout import RolloutDoc, RolloutState, Tick
from edgefleet.control.store import Deployment, Store


def succeed(store: Store, doc: RolloutDoc, ctx: Tick) -> None:
    """The last wave passed: the bundles become the group's deployment; the device pins go."""
    source = f"rollout:{doc.id}"
    for bundle in doc.spec.bundles:
        store.put_deployment(
            Deployment(
                scope="group", target=doc.spec.group, profile=bundle.profile, bundle_id=bundle.bundle_id,
                model_name=bundle.model_name, model_version=bundle.model_version, source=source,
                updated_at=ctx.now,
            )
        )  # fmt: skip
    pins = [d for d in store.deployments() if d.scope == "device" and d.source == source]
    for pin in pins:
        store.delete_deployment("device", pin.target, pin.profile)
    plan = plan_desired(store)
    for pin in pins:  # keep a pin where another (higher-priority) group would now win
        resolved = plan.get(pin.target)
        if resolved is None or resolved.bundle_id != pin.bundle_id:
            store.put_deployment(pin)
    ctx.desired_changed = True
    doc.state, doc.finished_at = "succeeded", ctx.now
    doc.outcome = f"all {len(doc.waves)} waves passed; {doc.spec.group} now runs the new bundles"
    doc.note(ctx.now, doc.outcome)


def start_rollback(store: Store, doc: RolloutDoc, ctx: Tick, ends_as: RolloutState) -> None:
    """Pin every device the rollout touched to the bundle it ran before, with the rollback flag."""
    now = ctx.now
    doc.state, doc.ends_as = "rolling-back", ends_as
    changed = False
    for progress in doc.devices.values():
        if progress.deployed_at is None or progress.profile is None:
            continue  # never touched
        if progress.previous_bundle == progress.target_bundle:
            continue
        if progress.previous_bundle is None:
            store.delete_deployment("device", progress.device_id, progress.profile)
            progress.state = "kept"
            progress.reason = (progress.reason + "; " if progress.reason else "") + (
                "ran no bundle before the rollout, so there is nothing to return to"
            )
            changed = True
            continue
        name, _, version = (progress.previous_model or "").rpartition("@")
        known = store.bundle(progress.previous_bundle)
        if known is not None:
            name, version = known.model_name, known.model_version
        store.put_deployment(
            Deployment(
                scope="device", target=progress.device_id, profile=progress.profile,
                bundle_id=progress.previous_bundle, model_name=name or "unknown", model_version=version or "0",
                rollback=True, source=f"rollback:{doc.id}", updated_at=now,
            )
        )  # fmt: skip
        if progress.state not in ("failed", "timed-out"):
            progress.reason = ""
        progress.state, progress.rollback_at = "rolling-back", now
        changed = True
    ctx.desired_changed = ctx.desired_changed or changed
    if not any(p.state == "rolling-back" for p in doc.devices.values()):
        doc.state, doc.finished_at = ends_as, now


def rolling_back(doc: RolloutDoc, ctx: Tick) -> None:
    """Devices back on their previous bundle, or timed out; the rollout ends when none is left."""
    timeout = doc.spec.timing.install_timeout_s
    for progress in doc.devices.values():
        if progress.state != "rolling-back":
            continue
        record = ctx.devices.get(progress.device_id)
        if record is not None and record.active_bundle == progress.previous_bundle and record.online:
            progress.state = "rolled-back"
        elif ctx.now - (progress.rollback_at or ctx.now) > timeout:
            progress.state = "rollback-timed-out"
            progress.reason = f"still not back on {progress.previous_bundle} after {timeout:g} s"
    if not any(p.state == "rolling-back" for p in doc.devices.values()):
        doc.state, doc.finished_at = doc.ends_as or "rolled-back", ctx.now
        counts = doc.counts()
        doc.note(
            ctx.now,
            f"{doc.state}: {counts.get('rolled-back', 0)} device(s) back on their previous bundle, "
            f"{counts.get('rollback-timed-out', 0)} timed out, {counts.get('kept', 0)} kept",
        )
