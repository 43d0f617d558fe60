"""What an operator can do to the fleet, once: the command line and the dashboard both call these.

Each operation checks its input, changes the store (the control plane's engine and desired-state publisher act
on it), and appends an entry to the store's audit trail with who did it, whether it worked or not.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, get_args

from edgefleet.control.fleet.registry import parse_labels
from edgefleet.control.rollout.commands import rollout_targets
from edgefleet.control.rollout.engine import load_doc, make_spec, prepare_rollout, request, to_row
from edgefleet.control.rollout.finish import can_roll_back
from edgefleet.control.rollout.plan import BundleRef, RolloutDoc, RolloutSpec, RolloutSpecError
from edgefleet.control.store import (
    ANY_PROFILE,
    FLEET_TARGET,
    AuditEntry,
    BundleRecord,
    Deployment,
    DeviceRecord,
    Scope,
    SlotPolicy,
    Store,
)
from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.messages import MAX_MS, SlotClass
from edgefleet.core.quality.golden_hold import default_max_golden_drop
from edgefleet.core.topics import DEFAULT_SLOT, check_segment, check_slot

SLOT_CLASSES: tuple[str, ...] = get_args(SlotClass)

COMMANDS = ("pause", "resume", "abort")


@dataclass(frozen=True)
class Operator:
    """Who acts (a token's name, or the user at a shell), through what, from where."""

    actor: str
    via: str = "cli"
    remote: str | None = None

    @classmethod
    def shell(cls) -> Operator:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls(f"cli:{user}@{socket.gethostname()}", "cli")


@dataclass
class _Audit:
    detail: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def audited(store: Store, who: Operator, action: str, target: str, **detail: Any) -> Iterator[_Audit]:
    """Record the operation in the audit trail: 'ok', or 'failed: why' (and re-raise)."""
    record = _Audit(dict(detail))
    try:
        yield record
    except Exception as err:
        store.add_audit(
            AuditEntry(time.time(), who.actor, action, target, f"failed: {err}", record.detail, who.via, who.remote)
        )
        setattr(err, _AUDITED, True)  # any exception takes an attribute
        raise
    store.add_audit(AuditEntry(time.time(), who.actor, action, target, "ok", record.detail, who.via, who.remote))


_AUDITED = "edgefleet_audited"  # set on an exception `audited` recorded


def record_failure(store: Store, who: Operator, action: str, target: str, err: Exception) -> None:
    """A request that failed before (or around) its operation: recorded unless the operation already did."""
    if getattr(err, _AUDITED, False):
        return
    store.add_audit(AuditEntry(time.time(), who.actor, action, target, f"failed: {err}", {}, who.via, who.remote))


def record_refusal(store: Store, who: Operator, action: str, target: str, reason: str) -> None:
    """A request refused before it reached an operation (no token, no CSRF token, another origin)."""
    store.add_audit(AuditEntry(time.time(), who.actor, action, target, f"refused: {reason}", {}, who.via, who.remote))


# --- bundles
def bundle_ref_of(record: BundleRecord) -> BundleRef:
    return BundleRef(
        bundle_id=record.bundle_id, model_name=record.model_name, model_version=record.model_version,
        profile=record.profile, accuracy_budget=record.accuracy_budget,
    )  # fmt: skip


def published_bundles(store: Store, bundle_ids: Sequence[str]) -> list[BundleRecord]:
    """The store's records of bundles already published; an unknown id lists the known ones."""
    found = []
    for bundle_id in bundle_ids:
        record = store.bundle(bundle_id)
        if record is None:
            raise UnknownNameError("published bundle", bundle_id, [b.bundle_id for b in store.bundle_records()])
        found.append(record)
    return found


# --- rollouts
def rollout_spec(
    bundles: Sequence[BundleRef], group: str, *, canary: str = "1", waves: Sequence[str] = ("25%", "50%", "100%"),
    thresholds: Mapping[str, Any] | None = None, timing: Mapping[str, Any] | None = None, max_failed_devices: int = 0,
    **more: Any,
) -> RolloutSpec:  # fmt: skip
    """A checked spec. A negative `max_golden_drop` means the default: the tightest accuracy budget of the bundles.
    `more`: further RolloutSpec fields, passed as they are."""
    limits = dict(thresholds or {})
    drop = limits.get("max_golden_drop", -1.0)
    if drop is not None and drop < 0:  # the converter's golden gate holds bundles to the same default
        limits["max_golden_drop"] = default_max_golden_drop(b.accuracy_budget for b in bundles)
    return make_spec(
        group=group, bundles=list(bundles), canary=canary, waves=[w.strip() for w in waves if w.strip()],
        thresholds=limits, timing=dict(timing or {}), max_failed_devices=max_failed_devices, **more,
    )  # fmt: skip


def check_rollout(store: Store, spec: RolloutSpec) -> None:
    """Fail before anything is published: the group must have devices by the host's records."""
    rollout_targets(store, spec.group)


def start_rollout(store: Store, who: Operator, spec: RolloutSpec) -> RolloutDoc:
    """Plan and save a rollout; the engine (the control plane holding the lease) drives it from there."""
    bundles = [b.bundle_id for b in spec.bundles]
    release = {"agent_release": spec.agent_release.release_id} if spec.agent_release else {}
    with audited(store, who, "rollout.start", spec.group, bundles=bundles, canary=spec.canary,
                 waves=list(spec.waves), **release) as audit:  # fmt: skip
        doc = prepare_rollout(store, spec)
        audit.detail["rollout"] = doc.id
    return doc


def rollout_command(store: Store, who: Operator, rollout_id: str, command: str) -> RolloutDoc:
    """Queue pause, resume or abort for the engine."""
    with audited(store, who, f"rollout.{command}", rollout_id):
        if command not in COMMANDS:
            raise UserInputError(f"unknown rollout command {command!r}; valid: {', '.join(COMMANDS)}")
        return request(store, rollout_id, command)


def rollback_rollout(store: Store, who: Operator, rollout_id: str) -> RolloutDoc:
    """Return the rollout's devices to what they ran before: an active rollout is aborted (the engine rolls back
    every device it touched); a succeeded one has its group deployments put back to the previous bundles; an ended
    one whose devices are still on its bundle (a rollback that timed out) has them pinned back again."""
    with audited(store, who, "rollout.rollback", rollout_id) as audit:
        row = store.rollout(rollout_id)
        if row is None:
            raise UnknownNameError("rollout", rollout_id, [r.id for r in store.rollouts()])
        doc = load_doc(row)
        if doc.active:
            audit.detail["how"] = "abort"
            return request(store, rollout_id, "abort")
        if not can_roll_back(doc):
            raise RolloutSpecError(
                f"rollout {rollout_id} ended {doc.state}; none of its devices is left on its bundles with a bundle to "
                "go back to"
            )
        audit.detail["how"] = "revert"
        audit.detail["reverted"] = _revert(store, doc)
        return doc


def _revert(store: Store, doc: RolloutDoc) -> dict[str, str | None]:
    """Pin each device the rollout left on its bundle back to its rollback target (rollback allowed; the store's
    record of it, never a device's report) and drop the group deployments the rollout made; returns device id →
    the bundle it goes back to (None: it has none, and keeps what it runs)."""
    now = time.time()
    source = f"rollback:{doc.id}"
    succeeded = doc.state == "succeeded"
    reverted: dict[str, str | None] = {}
    for p in doc.devices.values():
        if p.deployed_at is None or p.profile is None or p.previous_bundle == p.target_bundle:
            continue
        if not succeeded and p.state != "rollback-timed-out":
            continue  # already back, kept, or it never installed the bundle
        known = store.bundle(p.previous_bundle) if p.previous_bundle is not None else None
        reverted[p.device_id] = known.bundle_id if known else None
        if known is None:
            store.delete_deployment("device", p.device_id, p.profile, doc.spec.slot)
            continue
        store.put_deployment(
            Deployment(
                scope="device", target=p.device_id, profile=p.profile, bundle_id=known.bundle_id,
                model_name=known.model_name, model_version=known.model_version, rollback=True, source=source,
                updated_at=now, slot=doc.spec.slot,
            )
        )  # fmt: skip
    for d in store.deployments():
        if d.scope == "group" and d.target == doc.spec.group and d.source == f"rollout:{doc.id}":
            store.delete_deployment("group", d.target, d.profile, d.slot)
    doc.state, doc.ends_as = "rolled-back", None
    after = "succeeded" if succeeded else "ended"
    doc.outcome = f"rolled back by an operator after it {after} ({len(reverted)} devices)"
    doc.note(now, doc.outcome)
    doc.updated_at = now
    store.save_rollout(to_row(doc))
    return reverted


# --- devices and desired state
def label_device(
    store: Store, who: Operator, device_id: str, labels: Iterable[str], remove: Iterable[str] = ()
) -> DeviceRecord:
    """Set `key=value` labels and remove keys on one device."""
    labels, remove = list(labels), list(remove)
    with audited(store, who, "device.label", device_id, set=labels, remove=remove):
        parsed = parse_labels(labels)
        if not parsed and not remove:
            raise UserInputError("give labels as KEY=VALUE, or keys to remove")
        return store.set_labels(device_id, parsed, remove)


def _target(scope: Scope, target: str | None) -> str:
    if scope == "fleet":
        return FLEET_TARGET
    if scope not in ("group", "device") or not target:
        raise UserInputError(f"desired state for a {scope!r} needs a target; scopes: fleet, group, device")
    try:
        return check_segment(scope, target)
    except ValueError as err:
        raise UserInputError(str(err)) from err


def _slot(slot: str) -> str:
    try:
        return check_slot(slot)
    except ValueError as err:
        raise UserInputError(str(err)) from err


def set_desired(
    store: Store, who: Operator, scope: Scope, target: str | None, bundle: BundleRecord, rollback: bool = False,
    slot: str = DEFAULT_SLOT,
) -> Deployment:  # fmt: skip
    """Make a published bundle desired in one slot for the fleet (its profile's base), a group, or one device; the
    other slots are not touched."""
    with audited(store, who, "desired.set", f"{scope}:{target or FLEET_TARGET}", bundle=bundle.bundle_id,
                 rollback=rollback, slot=slot):  # fmt: skip
        deployment = Deployment(
            scope=scope, target=_target(scope, target), profile=bundle.profile, bundle_id=bundle.bundle_id,
            model_name=bundle.model_name, model_version=bundle.model_version, rollback=rollback, source="operator",
            updated_at=time.time(), slot=_slot(slot),
        )  # fmt: skip
        store.put_deployment(deployment)
        return deployment


def remove_slot(store: Store, who: Operator, scope: Scope, target: str | None, slot: str) -> Deployment:
    """Decide that a slot runs nothing for the fleet, a group or one device: the control plane publishes a signed
    removal (`Desired.remove`) and the devices drain the slot and unload it. It replaces the target's deployments
    of that slot; `clear_desired` of the slot withdraws the decision."""
    with audited(store, who, "desired.remove", f"{scope}:{target or FLEET_TARGET}", slot=slot):
        where = _target(scope, target)
        store.delete_deployment(scope, where, None, _slot(slot))
        deployment = Deployment(
            scope=scope, target=where, profile=ANY_PROFILE, bundle_id="", model_name="", model_version="",
            source="operator", updated_at=time.time(), slot=slot, remove=True,
        )  # fmt: skip
        store.put_deployment(deployment)
        return deployment


def set_slot_policy(
    store: Store, who: Operator, scope: Scope, target: str | None, slot: str, slot_class: str,
    latency_objective_ms: float | None = None,
) -> SlotPolicy:  # fmt: skip
    """Set how the devices of the fleet, a group or one device schedule a slot: its class and, for a real-time
    slot, its p95 latency objective (the neighbour guardrail's bar). Published with the slot's desired state; the
    bundle is unchanged, and rollouts of the slot keep it."""
    if slot_class not in SLOT_CLASSES:
        raise UserInputError(f"unknown slot class {slot_class!r}; classes: {', '.join(SLOT_CLASSES)}")
    if latency_objective_ms is not None:
        if slot_class != "real-time":
            raise UserInputError(f"a latency objective is a real-time slot's; slot {slot} would be {slot_class}")
        if not (0 < latency_objective_ms < MAX_MS):  # also refuses NaN
            raise UserInputError(f"a latency objective is a number of ms above 0 and below {MAX_MS:g}")
    with audited(store, who, "desired.schedule", f"{scope}:{target or FLEET_TARGET}", slot=slot,
                 slot_class=slot_class, latency_objective_ms=latency_objective_ms):  # fmt: skip
        policy = SlotPolicy(
            scope=scope, target=_target(scope, target), slot=_slot(slot), slot_class=cast(SlotClass, slot_class),
            latency_objective_ms=latency_objective_ms, updated_at=time.time(),
        )  # fmt: skip
        store.put_slot_policy(policy)
        return policy


def clear_slot_policy(store: Store, who: Operator, scope: Scope, target: str | None, slot: str) -> int:
    """Withdraw a target's policy of a slot: the next less specific one applies (or an interactive slot)."""
    with audited(store, who, "desired.unschedule", f"{scope}:{target or FLEET_TARGET}", slot=slot):
        removed = store.delete_slot_policy(scope, _target(scope, target), _slot(slot))
        if not removed:
            raise UserInputError(f"no policy of slot {slot} for {scope} {target or ''}")
        return removed


def clear_desired(
    store: Store, who: Operator, scope: Scope, target: str | None, profile: str | None = None,
    slot: str | None = None,
) -> int:  # fmt: skip
    """Remove a target's deployments (of one profile, of one slot; all of them by default); the next less specific
    one applies."""
    with audited(store, who, "desired.clear", f"{scope}:{target or FLEET_TARGET}", profile=profile, slot=slot):
        removed = store.delete_deployment(scope, _target(scope, target), profile, None if slot is None else _slot(slot))
        if not removed:
            what = ", ".join(x for x in (profile, f"slot {slot}" if slot else None) if x)
            raise UserInputError(f"no deployment for {scope} {target or ''}" + (f" ({what})" if what else ""))
        return removed
