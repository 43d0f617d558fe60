"""Control-plane commands: `control serve`, `devices`, `groups`, `desired`, `rollout`, and `fleet watch`.

Everything but `control serve` and `fleet watch` works on the store (`--store URL`, default
`$EDGEFLEET_STORE` or sqlite:///~/.edgefleet/control.sqlite) that `control serve` fills and acts on; the
commands that publish bundles (`rollout start`, `desired set`) also take the broker options.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import add_broker, add_json, connect, edgefleet_home, fmt, print_json, print_table, tls_files
from edgefleet.core.errors import UserInputError

if TYPE_CHECKING:
    from edgefleet.control.rollout import RolloutDoc
    from edgefleet.control.store import Scope, Store

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """ "90", "90s", "5m", "6h", "30d" → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 30s, 5m, 6h or 30d")
    return float(match[1]) * _UNITS[match[2]]


def optional_float(text: str) -> float | None:
    """A number, or `none` to switch a criterion off."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {text!r} (or 'none' to switch it off)") from err


def default_store() -> str:
    return os.environ.get("EDGEFLEET_STORE", f"sqlite://{edgefleet_home() / 'control.sqlite'}")


def add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=default_store(), help="control-plane store URL, sqlite:///PATH (env EDGEFLEET_STORE)"
    )


def open_from(args: argparse.Namespace) -> Store:
    from edgefleet.control.store import open_store

    return open_store(args.store)


def register(sub: argparse._SubParsersAction) -> None:
    control = sub.add_parser("control", help="the control plane: ingestion, rollouts, dashboard")
    verbs = control.add_subparsers(dest="verb", required=True, metavar="VERB")
    serve = verbs.add_parser("serve", help="ingest telemetry, run rollouts and serve the dashboard until Ctrl-C")
    add_broker(serve)
    add_store(serve)
    serve.add_argument("--http", default="127.0.0.1:8780", help="dashboard address HOST:PORT, or 'off'")
    serve.add_argument("--instance", default="main", help="this process's name (MQTT client id, lease holder)")
    serve.add_argument("--share-group", default="edgefleet", help="shared-subscription group; '' subscribes plainly")
    serve.add_argument(
        "--session-expiry", type=duration, default=600.0,
        help="how long the broker keeps this instance's session (and queues its share of telemetry) while it is "
        "down; restart under the same --instance within it and nothing is lost; 0 hands the share to the others",
    )  # fmt: skip
    serve.add_argument("--no-engine", action="store_true", help="ingest only; never run rollouts")
    serve.add_argument("--no-ingest", action="store_true", help="run rollouts and the dashboard only")
    serve.add_argument("--tick", type=duration, default=1.0, help="rollout engine period")
    serve.add_argument("--raw-retention", type=duration, default=6 * 3600.0, help="keep raw telemetry this long")
    serve.add_argument("--bucket", type=duration, default=60.0, help="downsampled bucket width")
    serve.add_argument("--rollup-retention", type=duration, default=30 * 86400.0, help="keep buckets this long")
    serve.add_argument("--event-retention", type=duration, default=30 * 86400.0, help="keep events this long")
    serve.set_defaults(func=cmd_control_serve)

    _register_devices(sub)
    _register_groups(sub)
    _register_desired(sub)
    _register_rollout(sub)


def register_fleet_watch(verbs: argparse._SubParsersAction) -> None:
    """`fleet watch`, added beside `fleet status` by edgefleet/cli/fleet_cmd.py."""
    watch = verbs.add_parser("watch", help="follow the fleet live: a table every interval and events as they come")
    watch.add_argument("--interval", type=duration, default=2.0, help="seconds between tables")
    watch.add_argument("--count", type=int, default=0, help="stop after this many tables (0: until Ctrl-C)")
    add_broker(watch)
    add_json(watch)
    watch.set_defaults(func=cmd_fleet_watch)


# --- control serve
def cmd_control_serve(args: argparse.Namespace) -> None:
    from edgefleet.control.server import ControlConfig, ControlPlane
    from edgefleet.core.topics import check_segment

    host, port = _http(args.http)
    try:
        check_segment("instance name", args.instance)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    config = ControlConfig(
        broker=args.broker, store_url=args.store, prefix=args.prefix, protocol=args.protocol, tls=tls_files(args),
        instance=args.instance, share_group=args.share_group or None, ingest=not args.no_ingest,
        engine=not args.no_engine, http_host=host, http_port=port, tick_s=args.tick,
        raw_retention_s=args.raw_retention, bucket_s=args.bucket, rollup_retention_s=args.rollup_retention,
        event_retention_s=args.event_retention, session_expiry_s=int(args.session_expiry),
    )  # fmt: skip
    plane = ControlPlane(config).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: plane.request_stop())
    parts = [f"control plane {args.instance} on {args.broker}, store {args.store}"]
    if plane.dashboard_url:
        parts.append(f"dashboard {plane.dashboard_url}")
    print("; ".join(parts), flush=True)
    try:
        plane.run_forever()
    finally:
        plane.stop()


def _http(text: str) -> tuple[str, int | None]:
    if text.lower() in ("off", "none", ""):
        return "127.0.0.1", None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise UserInputError(f"invalid --http {text!r}: use HOST:PORT (port 0 picks a free one) or off")
    return host or "127.0.0.1", int(port)


# --- fleet watch
def cmd_fleet_watch(args: argparse.Namespace) -> None:
    from edgefleet.cli.fleet_cmd import fleet_table
    from edgefleet.control.fleet import FleetView
    from edgefleet.core.messages import Event, MessageError, decode

    conn, topics = connect(args, "watch")

    def on_event(topic: str, payload: bytes, retained: bool) -> None:
        try:
            event = decode(Event, payload)
        except MessageError:
            return
        if args.json:
            print(json.dumps({"type": "event", **event.model_dump(mode="json")}), flush=True)
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
            print(f"{stamp} {event.device_id} {event.kind} {event.bundle_id or ''} {event.detail}", flush=True)

    try:
        view = FleetView(conn, topics)
        conn.subscribe(topics.all_events(), on_event)
        shown = 0
        while args.count <= 0 or shown < args.count:
            time.sleep(args.interval)
            rows = view.rows()
            if args.json:
                from edgefleet.cli.common import to_jsonable

                print(json.dumps({"type": "fleet", "ts": time.time(), "devices": to_jsonable(rows)}), flush=True)
            else:
                fleet_table(rows, title=f"fleet at {time.strftime('%H:%M:%S')}")
            shown += 1
    finally:
        conn.stop()


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


def _publish(args: argparse.Namespace, store: Store, bundles: list[Path]) -> list[Any]:
    """Publish bundle files (blocks + signed offer) and record them in the store; their manifests."""
    from edgefleet.control.publish import publish_bundle
    from edgefleet.control.store import BundleRecord

    conn, topics = connect(args, "control")
    manifests = []
    try:
        for path in bundles:
            manifest, offer = publish_bundle(conn, topics, path)
            store.put_bundle(
                BundleRecord(
                    manifest.bundle_id, manifest.model_name, manifest.model_version, manifest.profile,
                    offer.transfer.size, manifest.accuracy.budget, time.time(),
                )
            )  # fmt: skip
            manifests.append(manifest)
    finally:
        conn.stop()
    return manifests


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
        (manifest,) = _publish(args, store, [args.bundle])
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


# --- rollouts
def _register_rollout(sub: argparse._SubParsersAction) -> None:
    rollout = sub.add_parser("rollout", help="roll bundles out to a group in waves, with guardrails")
    verbs = rollout.add_subparsers(dest="verb", required=True, metavar="VERB")
    start = verbs.add_parser("start", help="publish bundles (one per profile) and start a rollout to a group")
    start.add_argument("bundles", type=Path, nargs="+", metavar="BUNDLE")
    start.add_argument("--group", required=True, help="host-side group, or an agent --group name")
    start.add_argument("--canary", default="1", help="first wave: a device count (1) or a share (10%%)")
    start.add_argument(
        "--waves", default="25%,50%,100%", help="cumulative wave sizes after the canary (default 25%%,50%%,100%%)"
    )
    t = start.add_argument_group("thresholds (per wave; 'none' switches one off)")
    t.add_argument("--max-latency-factor", type=optional_float, default=1.5, help="new p95 ≤ F × previous p95")
    t.add_argument("--latency-slack-ms", type=float, default=0.0, help="absolute slack on the latency limit")
    t.add_argument(
        "--max-golden-drop", type=optional_float, default=-1.0,
        help="golden agreement drop allowed vs the previous bundle (default: the bundles' accuracy budget)",
    )  # fmt: skip
    t.add_argument("--min-golden", type=optional_float, default=None, help="absolute floor for golden agreement")
    t.add_argument("--max-error-rate", type=optional_float, default=0.01, help="errors / requests at most this")
    t.add_argument("--min-requests", type=int, default=20, help="requests before latency and errors are judged")
    t.add_argument("--max-failed-devices", type=int, default=0, help="failures a wave tolerates")
    w = start.add_argument_group("timing")
    w.add_argument("--baseline", type=duration, default=30.0, help="telemetry window before each wave")
    w.add_argument("--observe", type=duration, default=60.0, help="how long each wave is watched")
    w.add_argument("--install-timeout", type=duration, default=300.0, help="devices not committed by then time out")
    w.add_argument("--report-timeout", type=duration, default=60.0, help="grace for late telemetry")
    w.add_argument("--min-reports", type=int, default=2, help="telemetry reports needed per device")
    start.add_argument("--no-publish", action="store_true", help="the bundles are already on the broker")
    add_broker(start)
    add_store(start)
    add_json(start)
    start.set_defaults(func=cmd_rollout_start)

    status = verbs.add_parser("status", help="every rollout, or one in detail")
    status.add_argument("rollout_id", nargs="?")
    add_store(status)
    add_json(status)
    status.set_defaults(func=cmd_rollout_status)
    for verb, text in (
        ("pause", "hold a rollout where it is (installs already asked for go on)"),
        ("resume", "continue a paused rollout"),
        ("abort", "stop a rollout and return every device it touched to its previous bundle"),
    ):
        command = verbs.add_parser(verb, help=text)
        command.add_argument("rollout_id")
        add_store(command)
        add_json(command)
        command.set_defaults(func=cmd_rollout_command, command=verb)


def cmd_rollout_start(args: argparse.Namespace) -> None:
    from edgefleet.control.rollout_engine import bundle_ref, make_spec, prepare_rollout
    from edgefleet.core.bundle import parse_manifest, read_signed_manifest
    from edgefleet.core.errors import BundleError

    manifests = []
    for path in args.bundles:
        try:
            manifests.append(parse_manifest(read_signed_manifest(path).manifest_json))
        except (OSError, BundleError) as err:
            raise UserInputError(f"{path} is not a readable bundle: {err}") from err
    drop = args.max_golden_drop
    if drop is not None and drop < 0:  # the default: the tightest accuracy budget among the bundles
        drop = min(m.accuracy.budget for m in manifests)
    spec = make_spec(
        group=args.group, bundles=[bundle_ref(m) for m in manifests], canary=args.canary,
        waves=[w.strip() for w in args.waves.split(",") if w.strip()],
        thresholds={
            "max_latency_factor": args.max_latency_factor, "latency_slack_ms": args.latency_slack_ms,
            "max_golden_drop": drop, "min_golden_agreement": args.min_golden, "max_error_rate": args.max_error_rate,
            "min_requests": args.min_requests,
        },
        timing={
            "baseline_s": args.baseline, "observe_s": args.observe, "install_timeout_s": args.install_timeout,
            "report_timeout_s": args.report_timeout, "min_reports": args.min_reports,
        },
        max_failed_devices=args.max_failed_devices,
    )  # fmt: skip
    store = open_from(args)
    try:
        from edgefleet.control.registry import require_members

        require_members(spec.group, store.groups(), store.devices())  # fail before publishing anything
        if not args.no_publish:
            _publish(args, store, args.bundles)
        doc = prepare_rollout(store, spec)
    finally:
        store.close()
    if args.json:
        print_json(_rollout_json(doc))
    else:
        sizes = ", ".join(str(len(w.devices)) for w in doc.waves)
        print(f"rollout {doc.id}: {len(doc.devices)} devices of {spec.group} in waves of {sizes}")
        print(f"follow it with: edgefleet rollout status {doc.id}")


def _rollout_json(doc: RolloutDoc) -> dict[str, Any]:
    from edgefleet.control.dashboard import rollout_summary

    return rollout_summary(doc) | {"document": doc.model_dump(mode="json")}


def cmd_rollout_status(args: argparse.Namespace) -> None:
    from edgefleet.control.rollout_engine import ENGINE_LEASE, load_doc
    from edgefleet.core.errors import UnknownNameError

    store = open_from(args)
    try:
        lease = store.lease(ENGINE_LEASE)
        if args.rollout_id:
            row = store.rollout(args.rollout_id)
            if row is None:
                raise UnknownNameError("rollout", args.rollout_id, [r.id for r in store.rollouts()])
            docs = [load_doc(row)]
        else:
            docs = [load_doc(r) for r in store.rollouts()]
    finally:
        store.close()
    engine = "running" if lease and lease[1] > time.time() else "not running"
    if args.json:
        if args.rollout_id:
            print_json(_rollout_json(docs[0]) | {"engine": engine})
        else:
            from edgefleet.control.dashboard import rollout_summary

            print_json({"engine": engine, "rollouts": [rollout_summary(d) for d in docs]})
        return
    if not args.rollout_id:
        print_table(
            f"rollouts (engine {engine})",
            ["rollout", "state", "group", "bundles", "wave", "devices", "outcome"],
            [
                (d.id, d.state, d.spec.group, ", ".join(b.bundle_id for b in d.spec.bundles),
                 f"{d.current_wave + 1}/{len(d.waves)}", _counts(d.counts()), d.outcome)
                for d in docs
            ],
        )  # fmt: skip
        return
    doc = docs[0]
    print(f"rollout {doc.id}: {doc.state} (engine {engine}); {doc.outcome}")
    print_table(
        "waves",
        ["wave", "state", "devices", "verdict"],
        [
            ("canary" if w.index == 0 else str(w.index), w.state,
             _counts({s: sum(1 for d in w.devices if doc.devices[d].state == s) for s in
                      {doc.devices[d].state for d in w.devices}}), w.verdict)
            for w in doc.waves
        ],
    )  # fmt: skip
    print_table(
        "devices",
        ["device", "wave", "state", "from", "to", "baseline p95", "p95", "golden", "reason"],
        [
            (p.device_id, p.wave, p.state, p.previous_bundle, p.target_bundle,
             fmt(p.baseline.p95_ms if p.baseline else None), fmt(p.observed.p95_ms if p.observed else None),
             fmt(p.observed.golden_agreement if p.observed else None, 3), p.reason)
            for p in sorted(doc.devices.values(), key=lambda p: (p.wave, p.device_id))
        ],
    )  # fmt: skip
    for entry in doc.log[-15:]:
        print(f"{time.strftime('%H:%M:%S', time.localtime(entry.ts))} {entry.message}")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def cmd_rollout_command(args: argparse.Namespace) -> None:
    from edgefleet.control.rollout_engine import request

    store = open_from(args)
    try:
        doc = request(store, args.rollout_id, args.command)
    finally:
        store.close()
    if args.json:
        print_json({"rollout": doc.id, "requested": args.command, "state": doc.state})
    else:
        print(f"{args.command} requested for rollout {doc.id} ({doc.state}); the control plane applies it")
    sys.stdout.flush()
