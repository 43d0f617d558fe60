"""Host commands on the broker: `broker`, `publish`, `deploy`, `fleet status`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_broker, add_json, connect, fmt, print_json, print_table
from edgefleet.core.errors import UserInputError
from edgefleet.core.transfer import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from edgefleet.control.fleet import DeviceRow

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run the embedded MQTT 3.1.1 broker (amqtt) until Ctrl-C")
    broker.add_argument("--host", default="127.0.0.1")
    broker.add_argument("--port", type=int, default=1883)
    broker.set_defaults(func=cmd_broker)

    publish = sub.add_parser("publish", help="publish a bundle's blocks and signed manifest (retained)")
    publish.add_argument("bundle", type=Path)
    publish.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="bytes per MQTT message")
    add_broker(publish)
    add_json(publish)
    publish.set_defaults(func=cmd_publish)

    dep = sub.add_parser("deploy", help="publish a bundle and make it the desired one for devices or groups")
    dep.add_argument("bundle", type=Path)
    dep.add_argument("--device", action="append", default=[], help="device id (repeatable)")
    dep.add_argument("--group", action="append", default=[], help="group name (repeatable)")
    dep.add_argument("--rollback", action="store_true", help="allow devices to go back to an older version")
    dep.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    add_broker(dep)
    add_json(dep)
    dep.set_defaults(func=cmd_deploy)

    fleet = sub.add_parser("fleet", help="the fleet as the broker sees it")
    verbs = fleet.add_subparsers(dest="verb", required=True, metavar="VERB")
    status = verbs.add_parser("status", help="retained status and latest telemetry of every device")
    status.add_argument("--wait", type=float, default=6.0, help="seconds to wait for telemetry")
    add_broker(status)
    add_json(status)
    status.set_defaults(func=cmd_fleet_status)
    from edgefleet.cli.control_cmd import register_fleet_watch

    register_fleet_watch(verbs)


def cmd_broker(args: argparse.Namespace) -> None:
    from edgefleet.control.embedded_broker import run_forever

    print(f"embedded MQTT 3.1.1 broker on mqtt://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    run_forever(args.host, args.port)


def cmd_publish(args: argparse.Namespace) -> None:
    from edgefleet.control.publish import publish_bundle

    conn, topics = connect(args, "publish")
    try:
        manifest, offer = publish_bundle(conn, topics, args.bundle, block_size=args.block_size)
    finally:
        conn.stop()
    if args.json:
        print_json(
            {"bundle_id": manifest.bundle_id, "bytes": offer.transfer.size, "blocks": offer.transfer.block_count}
        )
    else:
        print(f"published {manifest.bundle_id}: {offer.transfer.size} bytes in {offer.transfer.block_count} blocks")


def cmd_deploy(args: argparse.Namespace) -> None:
    from edgefleet.control.publish import deploy, publish_bundle

    if not args.device and not args.group:
        raise UserInputError("deploy needs at least one --device or --group")
    conn, topics = connect(args, "deploy")
    try:
        manifest, _ = publish_bundle(conn, topics, args.bundle, block_size=args.block_size)
        desired = deploy(conn, topics, manifest, devices=args.device, groups=args.group, rollback=args.rollback)
    finally:
        conn.stop()
    if args.json:
        print_json({"desired": desired, "devices": args.device, "groups": args.group})
    else:
        targets = ", ".join([f"device {d}" for d in args.device] + [f"group {g}" for g in args.group])
        print(f"{manifest.bundle_id} is now desired for {targets}")


def fleet_table(rows: list[DeviceRow], title: str = "fleet") -> None:
    print_table(
        title,
        [
            "device",
            "online",
            "state",
            "profile",
            "bundle",
            "provider",
            "verified",
            "p50 ms",
            "p95 ms",
            "golden",
            "CPU %",
            "RSS MB",
            "last error",
        ],
        [
            (
                r.device_id,
                "yes" if r.online else "no",
                r.state,
                r.profile,
                r.bundle,
                r.provider,
                "yes" if r.verified else "no",
                fmt(r.p50_ms),
                fmt(r.p95_ms),
                fmt(r.golden_agreement, 2),
                fmt(r.cpu_percent, 0),
                fmt(r.rss_mb, 0),
                r.last_error,
            )
            for r in rows
        ],
    )


def cmd_fleet_status(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet import FleetView

    conn, topics = connect(args, "fleet")
    try:
        view = FleetView(conn, topics)
        view.wait_for_telemetry(args.wait)
        rows = view.rows()
    finally:
        conn.stop()
    if args.json:
        print_json({"devices": rows})
    else:
        fleet_table(rows)
