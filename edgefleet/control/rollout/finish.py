"""How a rollout ends: the new bundles become the group's deployment of the rollout's slot, or every device it
touched goes back in that slot. The devices' other slots are never touched.

An agent-release rollout (agent_waves.py) ends with the release still named for every device it reached, or with
every device it touched named the release the store named before (with the signed downgrade the agents require) or
none: a device that committed the new agent and had no earlier release named keeps it ("kept", and why); one whose
launcher rolled it back already runs its previous agent."""

from __future__ import annotations

from edgefleet.control.desired.sync import plan_desired
from edgefleet.control.rollout.plan import DeviceProgress, RolloutDoc, RolloutState, Tick
from edgefleet.control.store import ANY_PROFILE, AgentReleaseTarget, Deployment, DeviceRecord, Store


def succeed(store: Store, doc: RolloutDoc, ctx: Tick) -> None:
    """The last wave passed: the bundles become the group's deployment; the device pins go."""
    source = f"rollout:{doc.id}"
    if doc.spec.agent_release is not None:  # the devices stay named the release (the store's rows)
        doc.state, doc.finished_at = "succeeded", ctx.now
        doc.outcome = f"all {len(doc.waves)} waves passed; {doc.spec.group} runs agent {doc.spec.agent_release.version}"
        doc.note(ctx.now, doc.outcome)
        return
    for bundle in doc.spec.bundles:
        store.put_deployment(
            Deployment(
                scope="group", target=doc.spec.group, profile=bundle.profile, bundle_id=bundle.bundle_id,
                model_name=bundle.model_name, model_version=bundle.model_version, source=source,
                updated_at=ctx.now, slot=doc.spec.slot,
            )
        )  # fmt: skip
    pins = [d for d in store.deployments() if d.scope == "device" and d.source == source]
    for pin in pins:
        store.delete_deployment("device", pin.target, pin.profile, pin.slot)
    plan = plan_desired(store)
    for pin in pins:  # keep a pin where another (higher-priority) group would now win
        resolved = plan.get((pin.target, pin.slot))
        if resolved is None or resolved.bundle_id != pin.bundle_id:
            store.put_deployment(pin)
    ctx.desired_changed = True
    doc.state, doc.finished_at = "succeeded", ctx.now
    doc.outcome = f"all {len(doc.waves)} waves passed; {doc.spec.group} now runs the new bundles"
    doc.note(ctx.now, doc.outcome)


def start_rollback(store: Store, doc: RolloutDoc, ctx: Tick, ends_as: RolloutState) -> None:
    """Pin every device the rollout touched to its rollback target (a bundle the store published and the device
    committed: `targets.rollback_target`), with the rollback flag. The target's id, name and version are the
    store's record, never the device's report. A device without a target keeps what it runs ("kept", and why); a
    device that refused the bundle never left its previous one ("refused"): its pin goes back all the same, so its
    desired state no longer names the bundle. A model new to its slot on a device that runs others goes away: the
    slot is removed there (a signed `Desired.remove`), so a newcomer that starved its neighbours does not stay."""
    now = ctx.now
    doc.state, doc.ends_as = "rolling-back", ends_as
    if doc.spec.agent_release is not None:
        _start_agent_rollback(store, doc, ctx)
        return
    changed = False
    for progress in doc.devices.values():
        if progress.deployed_at is None or progress.profile is None:
            continue  # never touched
        if progress.previous_bundle == progress.target_bundle:
            continue
        known = store.bundle(progress.previous_bundle) if progress.previous_bundle is not None else None
        if known is None and progress.state != "refused" and _newcomer(progress, ctx.devices.get(progress.device_id),
                                                                      doc.spec.slot):  # fmt: skip
            store.delete_deployment("device", progress.device_id, progress.profile, doc.spec.slot)
            store.put_deployment(
                Deployment(
                    scope="device", target=progress.device_id, profile=ANY_PROFILE, bundle_id="", model_name="",
                    model_version="", source=f"rollback:{doc.id}", updated_at=now, slot=doc.spec.slot, remove=True,
                )
            )  # fmt: skip
            note = f"slot {doc.spec.slot} was new on the device: it is removed"
            progress.reason = (progress.reason + "; " if progress.reason else "") + note
            progress.state, progress.rollback_at = "rolling-back", now
            changed = True
            continue
        if known is None:
            store.delete_deployment("device", progress.device_id, progress.profile, doc.spec.slot)
            why = progress.rollback_note or (
                f"{progress.previous_bundle} is not a bundle the store published" if progress.previous_bundle
                else "ran no bundle before the rollout, so there is nothing to return to"
            )  # fmt: skip
            progress.previous_bundle = None
            if progress.state != "refused":
                progress.state = "kept"
            progress.reason = (progress.reason + "; " if progress.reason else "") + why
            changed = True
            continue
        store.put_deployment(
            Deployment(
                scope="device", target=progress.device_id, profile=progress.profile, bundle_id=known.bundle_id,
                model_name=known.model_name, model_version=known.model_version, rollback=True,
                source=f"rollback:{doc.id}", updated_at=now, slot=doc.spec.slot,
            )
        )  # fmt: skip
        changed = True
        if progress.state == "refused":
            continue  # nothing was installed: it still runs its previous bundle
        if progress.state not in ("failed", "timed-out"):
            progress.reason = ""
        progress.state, progress.rollback_at = "rolling-back", now
    ctx.desired_changed = ctx.desired_changed or changed
    if not any(p.state == "rolling-back" for p in doc.devices.values()):
        _end(doc, now)


def _start_agent_rollback(store: Store, doc: RolloutDoc, ctx: Tick) -> None:
    """Every device the agent-release rollout touched is named the release it was named before, or none."""
    release = doc.spec.agent_release
    if release is None:
        return
    for progress in doc.devices.values():
        if progress.deployed_at is None:
            continue  # never touched
        previous = progress.previous_release
        if previous is not None:
            store.put_agent_release(
                AgentReleaseTarget(
                    progress.device_id, previous.release_id, previous.version, previous.release_id,
                    source=f"rollback:{doc.id}", updated_at=ctx.now,
                )
            )  # fmt: skip
        else:
            store.delete_agent_release(progress.device_id)
        ctx.desired_changed = True
        record = ctx.devices.get(progress.device_id)
        running = record.agent_version if record is not None else ""
        note = ""
        if running != release.version and (previous is None or running == previous.version):
            progress.state = "rolled-back" if progress.state != "refused" else "refused"
            note = f"runs agent {running or '?'}"
        elif previous is None:
            progress.state = "kept"
            note = f"no earlier agent release was named for it: it keeps agent {release.version}"
        else:
            progress.state, progress.rollback_at = "rolling-back", ctx.now
            note = f"named {previous.release_id} (agent {previous.version}) again"
        progress.reason = (progress.reason + "; " if progress.reason else "") + note
    if not any(p.state == "rolling-back" for p in doc.devices.values()):
        _end(doc, ctx.now)


def _newcomer(progress: DeviceProgress, record: DeviceRecord | None, slot: str) -> bool:
    """Whether the rollout brought a model to a slot that was empty on a device running other slots."""
    if progress.reported_bundle is not None or progress.previous_bundle is not None or record is None:
        return False
    return any(s.slot != slot and s.active_bundle for s in record.slots)


def rolling_back(doc: RolloutDoc, ctx: Tick) -> None:
    """Devices back on their previous bundle, or timed out; the rollout ends when none is left."""
    timeout = doc.spec.timing.install_timeout_s
    for progress in doc.devices.values():
        if progress.state != "rolling-back":
            continue
        record = ctx.devices.get(progress.device_id)
        previous = progress.previous_release
        if previous is not None and record is not None and record.online and record.agent_version == previous.version:
            progress.state = "rolled-back"
        elif previous is not None and ctx.now - (progress.rollback_at or ctx.now) > timeout:
            progress.state = "rollback-timed-out"
            progress.reason = f"still not back on agent {previous.version} after {timeout:g} s"
        elif previous is not None:
            continue
        elif record is not None and record.running(doc.spec.slot) == progress.previous_bundle and record.online:
            progress.state = "rolled-back"
        elif ctx.now - (progress.rollback_at or ctx.now) > timeout:
            progress.state = "rollback-timed-out"
            progress.reason = f"still not back on {progress.previous_bundle} after {timeout:g} s"
    if not any(p.state == "rolling-back" for p in doc.devices.values()):
        _end(doc, ctx.now)


def _end(doc: RolloutDoc, now: float) -> None:
    """The rollback is over: the final state says what happened (a failed wave that returned no device is
    "failed", not "rolled-back"), the log what happened to each device."""
    counts = doc.counts()
    state = doc.ends_as or "rolled-back"
    if state == "rolled-back" and not counts.get("rolled-back") and not counts.get("rollback-timed-out"):
        state = "failed"
    doc.state, doc.finished_at = state, now
    happened = ", ".join(
        f"{counts[s]} {label}"
        for s, label in (("rolled-back", "rolled back"), ("rollback-timed-out", "not back in time"), ("kept", "kept"),
                         ("refused", "refused"), ("passed", "passed"))
        if counts.get(s)
    )  # fmt: skip
    doc.note(now, f"{state}: {happened or 'no device was touched'}")


def can_roll_back(doc: RolloutDoc) -> bool:
    """Whether an operator's rollback does something: an active rollout (aborted), a succeeded one (reverted), or
    an ended one whose rollback timed out on a device that has somewhere to go back to (pinned back again)."""
    if doc.active or doc.state == "succeeded":
        return True
    return any(p.state == "rollback-timed-out" and p.previous_bundle is not None for p in doc.devices.values())
