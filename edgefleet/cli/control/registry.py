"""`edgefleet devices|groups`: the device registry and host-side groups in the store (desired state: desired_cmd.py)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import add_json, fmt, print_json, print_table
from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import DEFAULT_SLOT

if TYPE_CHECKING:
    from edgefleet.control.store import Deployment, DeviceRecord, Store, TelemetryPoint
    from edgefleet.core.messages import SlotStatus

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


from edgefleet.cli.control.common import add_store, open_from


def register(sub: argparse._SubParsersAction) -> None:
    _register_devices(sub)
    _register_groups(sub)


# --- devices
def _register_devices(sub: argparse._SubParsersAction) -> None:
    devices = sub.add_parser("devices", help="the device registry (what the control plane has seen)")
    verbs = devices.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every known device with its bundle, desired bundle and latest telemetry")
    listing.add_argument("--group", help="only members of this group")
    listing.add_argument("--selector", help="only devices matching this label selector, e.g. profile=x,site=a")
    add_store(listing)
    add_json(listing)
    listing.set_defaults(func=cmd_devices_list)
    show = verbs.add_parser("show", help="one device: status, labels, groups, desired state, telemetry, events")
    show.add_argument("device_id")
    add_store(show)
    add_json(show)
    show.set_defaults(func=cmd_devices_show)
    label = verbs.add_parser("label", help="set or remove operator labels (used by group selectors)")
    label.add_argument("device_id")
    label.add_argument("labels", nargs="*", metavar="KEY=VALUE")
    label.add_argument("--remove", action="append", default=[], metavar="KEY", help="remove a label (repeatable)")
    add_store(label)
    add_json(label)
    label.set_defaults(func=cmd_devices_label)
    enroll = verbs.add_parser(
        "enroll", help="the host registry's profile and groups of a device (its reports never change them)"
    )
    enroll.add_argument("device_id")
    enroll.add_argument("--profile", help="the device's hardware profile (default: the one it reports now)")
    enroll.add_argument("--group", action="append", default=[], help="a group it belongs to (repeatable)")
    enroll.add_argument(
        "--max-bytes-per-s", type=int, metavar="N",
        help="cap the device's bundle downloads at N bytes/s (a paid link), in its signed desired state; 0 lifts it",
    )  # fmt: skip
    add_store(enroll)
    add_json(enroll)
    enroll.set_defaults(func=cmd_devices_enroll)


def _device_rows(store: Store, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per slot of each device (a single model: its default slot; a device with nothing: one row)."""
    from edgefleet.control.desired.sync import device_plan, plan_desired
    from edgefleet.control.fleet.registry import Selector, memberships, require_members

    devices = store.devices()
    groups = store.groups()
    if args.group:
        devices = require_members(args.group, groups, devices)
    if args.selector:
        selector = Selector.parse(args.selector)
        devices = [d for d in devices if selector.matches(d)]
    member = memberships(groups, store.devices())
    plan = plan_desired(store)
    latest = store.latest_telemetry()
    now = time.time()
    rows = []
    for d in devices:
        wants = device_plan(plan, d.device_id)
        for name in sorted({s.slot for s in d.slots} | set(wants)) or [DEFAULT_SLOT]:
            slot, want, t = d.slot(name), wants.get(name), latest.get((d.device_id, name))
            rows.append(_device_row(d, name, slot, want, t, member, now))
    return rows


def _device_row(
    d: DeviceRecord, name: str, slot: SlotStatus | None, want: Deployment | None, t: TelemetryPoint | None,
    member: dict[str, set[str]], now: float,
) -> dict[str, Any]:  # fmt: skip
    from edgefleet.control.fleet.registry import host_view, registry_warnings

    desired = ("remove" if want.remove else want.bundle_id) if want else None
    return {
                "device_id": d.device_id, "slot": name, "online": d.online, "state": slot.state if slot else d.state,
                "profile": host_view(d).profile, "warnings": registry_warnings(d),
                "bundle": slot.active_bundle if slot else None, "verified": bool(slot and slot.verified),
                "provider": slot.provider_in_use if slot else None, "memory_mb": slot.memory_mb if slot else None,
                "refused": slot.refused if slot else None, "desired": desired,
                "groups": sorted(member.get(d.device_id, set())), "labels": dict(d.labels),
                "p50_ms": t.p50_ms if t else None, "p95_ms": t.p95_ms if t else None,
                "golden_agreement": t.golden_agreement if t else None,
                "last_seen_s": round(now - max(d.status_ts, t.ts if t else 0.0), 1),
                "last_error": (slot.last_error if slot else None) or d.last_error,
    }  # fmt: skip


def cmd_devices_list(args: argparse.Namespace) -> None:
    store = open_from(args)
    try:
        rows = _device_rows(store, args)
    finally:
        store.close()
    if args.json:
        print_json({"devices": rows})
        return
    print_table(
        f"devices ({len(rows)})",
        ["device", "slot", "online", "state", "profile", "bundle", "verified", "desired", "groups", "labels",
         "p95 ms", "golden", "seen", "warnings"],
        [
            (r["device_id"], r["slot"], "yes" if r["online"] else "no", r["state"], r["profile"], r["bundle"],
             "yes" if r["verified"] else "no", r["desired"], ",".join(r["groups"]),
             ",".join(f"{k}={v}" for k, v in r["labels"].items()), fmt(r["p95_ms"]), fmt(r["golden_agreement"], 2),
             f"{r['last_seen_s']:.0f} s ago", "; ".join(r["warnings"]) or "-")
            for r in rows
        ],
    )  # fmt: skip


def cmd_devices_show(args: argparse.Namespace) -> None:
    import dataclasses

    from edgefleet.control.desired.sync import device_plan, plan_desired
    from edgefleet.control.fleet.quality_view import latest_task, task_cell
    from edgefleet.control.fleet.registry import host_view, memberships, registry_warnings
    from edgefleet.core.errors import UnknownNameError

    store = open_from(args)
    try:
        device = store.device(args.device_id)
        if device is None:
            raise UnknownNameError("device", args.device_id, sorted(store.device_ids()))
        member = memberships(store.groups(), store.devices()).get(device.device_id, set())
        wants = device_plan(plan_desired(store), device.device_id)
        published = {slot: p for (d, slot), p in store.published().items() if d == device.device_id}
        telemetry = store.telemetry(device.device_id, time.time() - 3600)[-20:]
        events = store.events(device_id=device.device_id, limit=20)
        task = latest_task(store.quality(device.device_id, time.time() - 3600))
    finally:
        store.close()
    report = {
        "device": dataclasses.asdict(device)
        | {"labels": dict(device.labels), "slots": [s.model_dump(mode="json") for s in device.slots]},
        "groups": sorted(member),
        "registry_profile": host_view(device).profile,
        "warnings": registry_warnings(device),
        "desired": {slot: dataclasses.asdict(want) for slot, want in sorted(wants.items())},
        "published_desired": {slot: dataclasses.asdict(p) for slot, p in sorted(published.items())},
        "telemetry": [dataclasses.asdict(t) for t in telemetry],
        "golden_task": task.model_dump(mode="json") if task else None,
        "events": [dataclasses.asdict(e) for e in events],
    }
    if args.json:
        print_json(report)
        return
    d = device
    print_table(
        f"device {d.device_id}",
        ["field", "value"],
        [
            ("online", "yes" if d.online else "no"), ("state", d.state), ("profile", report["registry_profile"]),
            ("registry", "; ".join(registry_warnings(device)) or "matches the device's report"),
            ("agent", d.agent_version), ("hardware", f"{d.arch} {d.os} {d.hostname}"),
            ("groups", ", ".join(sorted(member)) or "-"),
            ("labels", ", ".join(f"{k}={v}" for k, v in d.labels.items()) or "-"),
            ("last error", d.last_error), ("golden task", task_cell(task) or "-"),
        ],
    )  # fmt: skip
    print_table(
        "slots",
        ["slot", "state", "bundle", "model", "provider", "verified", "memory MB", "objective ms", "desired", "refused"],
        [
            (name, s.state if s else "-", s.active_bundle if s else None, s.active_model if s else None,
             s.provider_in_use if s else None, "yes" if s and s.verified else "no",
             fmt(s.memory_mb, 0) if s else "-", fmt(s.latency_objective_ms) if s else "-",
             (("remove" if w.remove else f"{w.bundle_id} ({w.scope} {w.target}, {w.source})") if w else "-"),
             (s.refused if s else None) or "-")
            for name in sorted({x.slot for x in d.slots} | set(wants))
            for s, w in [(d.slot(name), wants.get(name))]
        ],
    )  # fmt: skip
    print_table(
        "latest telemetry",
        ["time", "slot", "bundle", "requests", "errors", "p50 ms", "p95 ms", "golden", "CPU %"],
        [
            (time.strftime("%H:%M:%S", time.localtime(t.ts)), t.slot, t.bundle_id, t.requests, t.errors, fmt(t.p50_ms),
             fmt(t.p95_ms), fmt(t.golden_agreement, 2), fmt(t.cpu_percent, 0))
            for t in telemetry
        ],
    )  # fmt: skip
    print_table(
        "recent events",
        ["time", "kind", "bundle", "detail"],
        [(time.strftime("%H:%M:%S", time.localtime(e.ts)), e.kind, e.bundle_id, e.detail) for e in events],
    )


def cmd_devices_label(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    store = open_from(args)
    try:
        device = ops.label_device(store, ops.Operator.shell(), args.device_id, args.labels, args.remove)
    finally:
        store.close()
    if args.json:
        print_json({"device_id": device.device_id, "labels": dict(device.labels)})
    else:
        shown = ", ".join(f"{k}={v}" for k, v in device.labels.items()) or "(none)"
        print(f"{device.device_id} labels: {shown}")


def cmd_devices_enroll(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet.registry import REGISTRY_LINK_CAP, enrolment_labels, host_view, link_cap

    store = open_from(args)
    try:
        known = store.device(args.device_id)
        # No --profile: the operator confirms the profile the device reports now; it never changes by itself after.
        profile = args.profile or (known.profile if known else None)
        labels, lift = enrolment_labels(profile, args.group), []
        if args.max_bytes_per_s is not None:
            if args.max_bytes_per_s < 0:
                raise UserInputError("--max-bytes-per-s takes a byte rate (0 lifts the cap)")
            if args.max_bytes_per_s:
                labels[REGISTRY_LINK_CAP] = str(args.max_bytes_per_s)
            else:
                lift.append(REGISTRY_LINK_CAP)
        device = store.set_labels(args.device_id, labels, lift)
    finally:
        store.close()
    view = host_view(device)
    if args.json:
        cap = link_cap(device)
        print_json({"device_id": view.device_id, "profile": view.profile, "groups": list(view.groups),
                    "max_bytes_per_s": cap})  # fmt: skip
    else:
        cap_text = f", link cap {link_cap(device)} B/s" if link_cap(device) else ""
        print(
            f"{view.device_id}: profile {view.profile or '-'}, groups {', '.join(view.groups) or '-'}{cap_text} "
            "(host registry)"
        )


# --- groups
def _register_groups(sub: argparse._SubParsersAction) -> None:
    groups = sub.add_parser("groups", help="host-side groups: static device lists and label selectors")
    verbs = groups.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every group with its members")
    add_store(listing)
    add_json(listing)
    listing.set_defaults(func=cmd_groups_list)
    put = verbs.add_parser("set", help="define or replace a group")
    put.add_argument("name")
    put.add_argument("--device", action="append", default=[], help="a member device id (repeatable)")
    put.add_argument("--selector", help="members by labels, e.g. 'profile=intel-x86-vnni,site=berlin'")
    put.add_argument("--priority", type=int, default=0, help="which group's deployment wins for a device in several")
    add_store(put)
    add_json(put)
    put.set_defaults(func=cmd_groups_set)
    delete = verbs.add_parser("delete", help="remove a group definition")
    delete.add_argument("name")
    add_store(delete)
    delete.set_defaults(func=cmd_groups_delete)


def cmd_groups_list(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet.registry import group_members

    store = open_from(args)
    try:
        devices = store.devices()
        groups = store.groups()
        agent_groups = sorted({g for d in devices for g in d.groups} - set(groups))
        rows: list[dict[str, Any]] = [
            {"name": g.name, "kind": "host", "devices": list(g.devices), "selector": g.selector,
             "priority": g.priority, "members": [d.device_id for d in group_members(g.name, groups, devices)]}
            for g in groups.values()
        ] + [
            {"name": name, "kind": "agent", "devices": [], "selector": None, "priority": 0,
             "members": [d.device_id for d in group_members(name, groups, devices)]}
            for name in agent_groups
        ]  # fmt: skip
    finally:
        store.close()
    if args.json:
        print_json({"groups": rows})
        return
    print_table(
        "groups",
        ["group", "kind", "priority", "selector", "static devices", "members"],
        [
            (r["name"], r["kind"], r["priority"], r["selector"], ",".join(r["devices"]) or None,
             f"{len(r['members'])}: {','.join(r['members'][:8])}{'…' if len(r['members']) > 8 else ''}")
            for r in rows
        ],
    )  # fmt: skip


def cmd_groups_set(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet.registry import Selector
    from edgefleet.control.store import GroupDef
    from edgefleet.core.topics import check_segment

    try:
        name = check_segment("group", args.name)
        devices = tuple(check_segment("device id", d) for d in args.device)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    if not devices and not args.selector:
        raise UserInputError("a group needs --device or --selector (or both)")
    if args.selector:
        Selector.parse(args.selector)
    group = GroupDef(name, devices, args.selector, args.priority)
    store = open_from(args)
    try:
        store.put_group(group)
    finally:
        store.close()
    if args.json:
        print_json(group)
    else:
        print(f"group {name} set")


def cmd_groups_delete(args: argparse.Namespace) -> None:
    from edgefleet.core.errors import UnknownNameError

    store = open_from(args)
    try:
        if not store.delete_group(args.name):
            raise UnknownNameError("group", args.name, store.groups())
    finally:
        store.close()
    print(f"group {args.name} deleted")
