"""The dashboard's state-changing requests: JSON bodies in, `edgefleet.control.operations` called, JSON out.

    POST /api/rollouts                      {"bundles": [ID…], "group": G, "canary": "1", "waves": "25%,50%,100%",
                                             "thresholds": {…}, "timing": {…}, "max_failed_devices": 0}
    POST /api/rollouts/ID/pause|resume|abort|rollback
    POST /api/devices/ID/labels             {"set": ["k=v"…], "remove": ["k"…]}
    POST /api/desired                       {"scope": "fleet|group|device", "target": T, "bundle": ID,
                                             "rollback": false}
    POST /api/desired/clear                 {"scope": …, "target": T, "profile": P|null}

The same operations the command line runs (rollout start/pause/resume/abort/rollback, devices label, desired
set/clear); the audit entry is written by the operation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from edgefleet.control import operations as ops
from edgefleet.control.dashboard.views import rollout_summary
from edgefleet.control.store import Scope, Store
from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import check_segment

# Further RolloutSpec fields a start request may carry as they are (the spec validates them).
SPEC_EXTRAS = ("allow_unjudged", "shadow", "slot")
Action = Callable[[Store, ops.Operator, list[str], Mapping[str, Any]], dict[str, Any]]


def _str(body: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(f"{key!r} must be a non-empty string")
    return value.strip()


def _strings(body: Mapping[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserInputError(f"{key!r} must be a list of strings")
    return value


def _mapping(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise UserInputError(f"{key!r} must be an object")
    return value


def start_rollout(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    bundle_ids = _strings(body, "bundles")
    if not bundle_ids:
        raise UserInputError("choose at least one published bundle")
    max_failed = body.get("max_failed_devices", 0)
    if not isinstance(max_failed, int) or isinstance(max_failed, bool):
        raise UserInputError("'max_failed_devices' must be a whole number")
    refs = [ops.bundle_ref_of(r) for r in ops.published_bundles(store, bundle_ids)]
    spec = ops.rollout_spec(
        refs, _str(body, "group"), canary=_str(body, "canary", "1"),
        waves=_str(body, "waves", "25%,50%,100%").split(","), thresholds=_mapping(body, "thresholds"),
        timing=_mapping(body, "timing"), max_failed_devices=max_failed,
        **{key: body[key] for key in SPEC_EXTRAS if key in body},
    )  # fmt: skip
    return rollout_summary(ops.start_rollout(store, who, spec))


def rollout_verb(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    rollout_id, verb = parts[2], parts[3]
    if verb == "rollback":
        doc = ops.rollback_rollout(store, who, rollout_id)
    else:
        doc = ops.rollout_command(store, who, rollout_id, verb)
    return {"rollout": doc.id, "requested": verb, "state": doc.state}


def label(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    device = ops.label_device(store, who, check_segment("device id", parts[2]), _strings(body, "set"),
                              _strings(body, "remove"))  # fmt: skip
    return {"device_id": device.device_id, "labels": dict(device.labels)}


def _scope(body: Mapping[str, Any]) -> tuple[Scope, str | None]:
    scope = _str(body, "scope")
    if scope not in ("fleet", "group", "device"):
        raise UserInputError(f"unknown scope {scope!r}; valid: fleet, group, device")
    target = body.get("target")
    if target is not None and not isinstance(target, str):
        raise UserInputError("'target' must be a string")
    return cast(Scope, scope), (target or None)


def set_desired(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    scope, target = _scope(body)
    (record,) = ops.published_bundles(store, [_str(body, "bundle")])
    rollback = body.get("rollback", False)
    if not isinstance(rollback, bool):
        raise UserInputError("'rollback' must be true or false")
    d = ops.set_desired(store, who, scope, target, record, rollback, _str(body, "slot", "default"))
    return {
        "scope": d.scope, "target": d.target, "profile": d.profile, "slot": d.slot, "bundle": d.bundle_id,
        "rollback": d.rollback,
    }  # fmt: skip


def clear_desired(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    scope, target = _scope(body)
    profile = body.get("profile") or None
    if profile is not None and not isinstance(profile, str):
        raise UserInputError("'profile' must be a string")
    slot = body.get("slot") or None
    if slot is not None and not isinstance(slot, str):
        raise UserInputError("'slot' must be a string")
    return {"removed": ops.clear_desired(store, who, scope, target, profile, slot)}


def schedule_slot(store: Store, who: ops.Operator, parts: list[str], body: Mapping[str, Any]) -> dict[str, Any]:
    scope, target = _scope(body)
    objective = body.get("latency_objective_ms")
    if objective is not None and (isinstance(objective, bool) or not isinstance(objective, int | float)):
        raise UserInputError("'latency_objective_ms' must be a number")
    p = ops.set_slot_policy(store, who, scope, target, _str(body, "slot"), _str(body, "slot_class"),
                            None if objective is None else float(objective))  # fmt: skip
    return {"scope": p.scope, "target": p.target, "slot": p.slot, "slot_class": p.slot_class,
            "latency_objective_ms": p.latency_objective_ms}  # fmt: skip


def route(parts: list[str]) -> tuple[str, Action] | None:
    """(audit action name, handler) for a POST path under /api, or None."""
    if parts == ["api", "rollouts"]:
        return "rollout.start", start_rollout
    if len(parts) == 4 and parts[:2] == ["api", "rollouts"] and parts[3] in (*ops.COMMANDS, "rollback"):
        return f"rollout.{parts[3]}", rollout_verb
    if len(parts) == 4 and parts[:2] == ["api", "devices"] and parts[3] == "labels":
        return "device.label", label
    if parts == ["api", "desired"]:
        return "desired.set", set_desired
    if parts == ["api", "desired", "clear"]:
        return "desired.clear", clear_desired
    if parts == ["api", "desired", "schedule"]:
        return "desired.schedule", schedule_slot
    return None
