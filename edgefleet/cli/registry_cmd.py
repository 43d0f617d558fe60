"""`edgefleet devices|groups|desired`: the device registry, host-side groups and desired state, in the store."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import add_broker, add_json, fmt, print_json, print_table
from edgefleet.core.errors import UserInputError

if TYPE_CHECKING:
    from edgefleet.control.store import Scope, Store

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


from edgefleet.cli.control_common import add_store, open_from, publish_bundles


def register(sub: argparse._SubParsersAction) -> None:
    _register_devices(sub)
    _register_groups(sub)
    _register_desired(sub)


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


def _device_rows(store: Store, args: argparse.Namespace) -> list[dict[str, Any]]:
    from edgefleet.control.desired import plan_desired
    from edgefleet.control.registry import Selector, memberships, require_members

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
        t = latest.get(d.device_id)
        want = plan.get(d.device_id)
        rows.append(
            {
                "device_id": d.device_id, "online": d.online, "state": d.state, "profile": d.profile,
                "bundle": d.active_bundle, "verified": d.verified, "desired": want.bundle_id if want else None,
                "groups": sorted(member.get(d.device_id, set())), "labels": dict(d.labels),
                "p50_ms": t.p50_ms if t else None, "p95_ms": t.p95_ms if t else None,
                "golden_agreement": t.golden_agreement if t else None,
                "last_seen_s": round(now - max(d.status_ts, t.ts if t else 0.0), 1), "last_error": d.last_error,
            }
        )  # fmt: skip
    return rows


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
        ["device", "online", "state", "profile", "bundle", "verified", "desired", "groups", "labels", "p95 ms",
         "golden", "seen"],
        [
            (r["device_id"], "yes" if r["online"] else "no", r["state"], r["profile"], r["bundle"],
             "yes" if r["verified"] else "no", r["desired"], ",".join(r["groups"]),
             ",".join(f"{k}={v}" for k, v in r["labels"].items()), fmt(r["p95_ms"]), fmt(r["golden_agreement"], 2),
             f"{r['last_seen_s']:.0f} s ago")
            for r in rows
        ],
    )  # fmt: skip


def cmd_devices_show(args: argparse.Namespace) -> None:
    import dataclasses

    from edgefleet.control.desired import plan_desired
    from edgefleet.control.registry import memberships
    from edgefleet.core.errors import UnknownNameError

    store = open_from(args)
    try:
        device = store.device(args.device_id)
        if device is None:
            raise UnknownNameError("device", args.device_id, sorted(store.device_ids()))
        member = memberships(store.groups(), store.devices()).get(device.device_id, set())
        want = plan_desired(store).get(device.device_id)
        published = store.published().get(device.device_id)
        telemetry = store.telemetry(device.device_id, time.time() - 3600)[-20:]
        events = store.events(device_id=device.device_id, limit=20)
    finally:
        store.close()
    report = {
        "device": dataclasses.asdict(device) | {"labels": dict(device.labels)},
        "groups": sorted(member),
        "desired": dataclasses.asdict(want) if want else None,
        "published_desired": dataclasses.asdict(published) if published else None,
        "telemetry": [dataclasses.asdict(t) for t in telemetry],
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
            ("online", "yes" if d.online else "no"), ("state", d.state), ("profile", d.profile),
            ("agent", d.agent_version), ("hardware", f"{d.arch} {d.os} {d.hostname}"),
            ("bundle", d.active_bundle), ("model", d.active_model), ("provider", d.provider),
            ("verified", "yes" if d.verified else "no"), ("groups", ", ".join(sorted(member)) or "-"),
            ("labels", ", ".join(f"{k}={v}" for k, v in d.labels.items()) or "-"),
            ("desired", f"{want.bundle_id} ({want.scope} {want.target}, {want.source})" if want else "-"),
            ("last error", d.last_error),
        ],
    )  # fmt: skip
    print_table(
        "latest telemetry",
        ["time", "bundle", "requests", "errors", "p50 ms", "p95 ms", "golden", "CPU %"],
        [
            (time.strftime("%H:%M:%S", time.localtime(t.ts)), t.bundle_id, t.requests, t.errors, fmt(t.p50_ms),
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
    from edgefleet.control.registry import parse_labels

    labels = parse_labels(args.labels)
    if not labels and not args.remove:
        raise UserInputError("give labels as KEY=VALUE, or --remove KEY")
    store = open_from(args)
    try:
        device = store.set_labels(args.device_id, labels, args.remove)
    finally:
        store.close()
    if args.json:
        print_json({"device_id": device.device_id, "labels": dict(device.labels)})
    else:
        shown = ", ".join(f"{k}={v}" for k, v in device.labels.items()) or "(none)"
        print(f"{device.device_id} labels: {shown}")


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
    from edgefleet.control.registry import group_members

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
    from edgefleet.control.registry import Selector
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


# --- desired state
def _register_desired(sub: argparse._SubParsersAction) -> None:
    desired = sub.add_parser("desired", help="desired state: a fleet-wide base, group deployments, device overrides")
    verbs = desired.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every deployment, most specific first")
    add_store(listing)
    add_json(listing)
    listing.set_defaults(func=cmd_desired_list)
    put = verbs.add_parser("set", help="publish a bundle and make it desired for the fleet, a group or a device")
    put.add_argument("bundle", type=Path)
    scope = put.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true", help="the base deployment for the bundle's profile")
    scope.add_argument("--group", help="a group's deployment")
    scope.add_argument("--device", help="a device override")
    put.add_argument("--rollback", action="store_true", help="allow devices to go back to an older version")
    add_broker(put)
    add_store(put)
    add_json(put)
    put.set_defaults(func=cmd_desired_set)
    clear = verbs.add_parser("clear", help="remove a deployment (the next less specific one applies)")
    scope = clear.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true")
    scope.add_argument("--group")
    scope.add_argument("--device")
    clear.add_argument("--profile", help="only this profile's deployment")
    add_store(clear)
    clear.set_defaults(func=cmd_desired_clear)


def cmd_desired_list(args: argparse.Namespace) -> None:
    store = open_from(args)
    try:
        order = {"device": 0, "group": 1, "fleet": 2}
        rows = sorted(store.deployments(), key=lambda d: (order[d.scope], d.target, d.profile))
    finally:
        store.close()
    if args.json:
        print_json({"deployments": rows})
        return
    print_table(
        "desired state (device overrides, then groups, then the fleet base)",
        ["scope", "target", "profile", "bundle", "version", "rollback", "source"],
        [(d.scope, d.target, d.profile, d.bundle_id, d.model_version, "yes" if d.rollback else "", d.source)
         for d in rows],
    )  # fmt: skip


def cmd_desired_set(args: argparse.Namespace) -> None:
    from edgefleet.control.store import FLEET_TARGET, Deployment
    from edgefleet.core.topics import check_segment

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    try:
        target = FLEET_TARGET if args.fleet else check_segment(scope, args.group or args.device)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    store = open_from(args)
    try:
        (manifest,) = publish_bundles(args, store, [args.bundle])
        deployment = Deployment(
            scope=scope, target=target, profile=manifest.profile, bundle_id=manifest.bundle_id,
            model_name=manifest.model_name, model_version=manifest.model_version, rollback=args.rollback,
            source="operator", updated_at=time.time(),
        )  # fmt: skip
        store.put_deployment(deployment)
    finally:
        store.close()
    if args.json:
        print_json(deployment)
    else:
        print(f"{manifest.bundle_id} desired for {scope} {target} ({manifest.profile}); the control plane publishes it")


def cmd_desired_clear(args: argparse.Namespace) -> None:
    from edgefleet.control.store import FLEET_TARGET

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    target = FLEET_TARGET if args.fleet else (args.group or args.device)
    store = open_from(args)
    try:
        removed = store.delete_deployment(scope, target, args.profile)
    finally:
        store.close()
    if not removed:
        raise UserInputError(f"no deployment for {scope} {target}" + (f" ({args.profile})" if args.profile else ""))
    print(f"removed {removed} deployment(s) of {scope} {target}")
