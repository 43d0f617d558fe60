"""Host commands on the broker: `broker`, `publish`, `deploy`, `fleet status`, `fleet watch`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_broker, add_json, connect, fmt, print_json, print_table
from edgefleet.cli.control.common import duration
from edgefleet.core.errors import UserInputError
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from edgefleet.control.fleet.quality_view import QualityRow
    from edgefleet.control.fleet.status import DeviceRow
    from edgefleet.core.messages import AgentRelease
    from edgefleet.core.mqtt.connection import Connection
    from edgefleet.core.topics import Topics

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.

LAYOUT_HELP = (
    "chunks (default): content-addressed chunks shared across versions, so a device fetches only what changed; "
    "blocks: the first layout (fixed blocks per bundle), for agents from before chunks or an acl_file broker"
)


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run the embedded MQTT 3.1.1 broker (amqtt) until Ctrl-C")
    broker.add_argument("--host", default="127.0.0.1")
    broker.add_argument("--port", type=int, default=1883)
    broker.set_defaults(func=cmd_broker)

    publish = sub.add_parser("publish", help="publish a bundle's blocks and signed manifest (retained)")
    publish.add_argument("bundle", type=Path)
    publish.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="bytes per MQTT message")
    publish.add_argument("--layout", choices=("chunks", "blocks"), default="chunks", help=LAYOUT_HELP)
    add_broker(publish)
    add_json(publish)
    publish.set_defaults(func=cmd_publish)

    unpub = sub.add_parser(
        "unpublish", help="clear a bundle's offer and the chunks no other bundle lists (refused while desired)"
    )
    unpub.add_argument("bundle_id")
    unpub.add_argument("--force", action="store_true", help="even when desired state still names it")
    add_broker(unpub)
    add_json(unpub)
    unpub.set_defaults(func=cmd_unpublish)

    dep = sub.add_parser("deploy", help="publish a bundle and make it the desired one for devices or groups")
    dep.add_argument("bundle", type=Path)
    dep.add_argument("--device", action="append", default=[], help="device id (repeatable)")
    dep.add_argument("--group", action="append", default=[], help="group name (repeatable)")
    dep.add_argument(
        "--slot", default="default", help="the slot (model) to set; the devices' other slots are left alone"
    )
    dep.add_argument("--rollback", action="store_true", help="allow devices to go back to an older version")
    dep.add_argument(
        "--max-bytes-per-s", type=int, metavar="N",
        help="cap the devices' downloads at N bytes/s (paid links), in the signed desired state",
    )  # fmt: skip
    dep.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    dep.add_argument("--layout", choices=("chunks", "blocks"), default="chunks", help=LAYOUT_HELP)
    dep.add_argument(
        "--agent-release", type=Path, metavar="FILE",
        help="also publish this agent release (`edgefleet release build`) and name it in the signed desired state: "
        "the devices update their agent, under their launcher's health gate (docs/agent.md)",
    )  # fmt: skip
    dep.add_argument(
        "--agent-downgrade", action="store_true",
        help="allow the devices to go back to this (older) agent release: the document names it exactly",
    )  # fmt: skip
    dep.add_argument(
        "--broker-rights", choices=["auto", "dynsec", "none"], default="auto",
        help="grant the devices read rights on the bundle first (dynsec: Mosquitto's plugin; auto: when it answers)",
    )  # fmt: skip
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
    register_fleet_watch(verbs)


def readable_bundle(path: Path) -> None:
    """A bundle file that is not there or not a bundle fails before anything connects or publishes."""
    from edgefleet.core.bundle.archive import read_signed_manifest

    read_signed_manifest(path)  # its BundleError says what is wrong with the file


def cmd_broker(args: argparse.Namespace) -> None:
    from edgefleet.control.broker.embedded import run_forever

    print(f"embedded MQTT 3.1.1 broker on mqtt://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    run_forever(args.host, args.port)


def cmd_publish(args: argparse.Namespace) -> None:
    from edgefleet.control.publish.publisher import publish_bundle

    readable_bundle(args.bundle)
    conn, topics = connect(args, "publish")
    try:
        manifest, offer = publish_bundle(conn, topics, args.bundle, block_size=args.block_size, layout=args.layout)
    finally:
        conn.stop()
    transfer = offer.transfer
    # a long chunk list travels on index pages (core/transfer/chunk_index.py)
    chunks = transfer.chunk_count or len(transfer.chunks)
    if args.json:
        print_json({"bundle_id": manifest.bundle_id, "bytes": transfer.size, "blocks": transfer.block_count,
                    "chunks": chunks, "index_pages": len(transfer.index)})  # fmt: skip
    else:
        pieces = f"{chunks} chunks" if chunks else f"{transfer.block_count} blocks"
        print(f"published {manifest.bundle_id}: {transfer.size} bytes in {pieces}")


def cmd_unpublish(args: argparse.Namespace) -> None:
    from edgefleet.control.publish.retention import unpublish

    conn, topics = connect(args, "unpublish")
    try:
        cleared = unpublish(conn, topics, args.bundle_id, force=args.force)
    finally:
        conn.stop()
    if args.json:
        print_json({"bundle_id": args.bundle_id, "chunks_cleared": len(cleared)})
    else:
        print(f"unpublished {args.bundle_id}: {len(cleared)} chunk(s) no other bundle lists were cleared")


def cmd_deploy(args: argparse.Namespace) -> None:
    from edgefleet.control.publish.publisher import deploy, publish_bundle
    from edgefleet.control.rights.deploy import grant_deploy

    if not args.device and not args.group:
        raise UserInputError("deploy needs at least one --device or --group")
    if args.max_bytes_per_s is not None and args.max_bytes_per_s <= 0:
        raise UserInputError("--max-bytes-per-s takes a positive byte rate")
    readable_bundle(args.bundle)
    conn, topics = connect(args, "deploy")
    try:
        agent_release = _publish_agent_release(conn, topics, args) if args.agent_release else None
        manifest, _ = publish_bundle(conn, topics, args.bundle, block_size=args.block_size, layout=args.layout)
        rights = grant_deploy(  # before any device hears of the bundle (broker_rights_deploy.py)
            conn, topics, manifest.bundle_id, devices=args.device, groups=args.group, mode=args.broker_rights,
            slot=args.slot,
        )  # fmt: skip
        desired = deploy(conn, topics, manifest, devices=args.device, groups=args.group, rollback=args.rollback,
                         max_bytes_per_s=args.max_bytes_per_s, slot=args.slot,
                         agent_release=agent_release)  # fmt: skip
    finally:
        conn.stop()
    if args.json:
        print_json({"desired": desired, "devices": args.device, "groups": args.group, "rights": rights})
    else:
        targets = ", ".join([f"device {d}" for d in args.device] + [f"group {g}" for g in args.group])
        print(f"{manifest.bundle_id} is now desired in slot {args.slot} for {targets}")
        granted = f"granted to {', '.join(rights.devices) or 'no device'}" if rights.managed else "not managed"
        print(f"broker rights ({rights.reason}): {granted}")
        if rights.unknown:
            print(f"warning: the broker has no role for {', '.join(rights.unknown)} (`edgefleet keys enroll`)")


def fleet_table(rows: list[DeviceRow], title: str = "fleet") -> None:
    print_table(
        title,
        [
            "device",
            "slot",
            "online",
            "state",
            "profile",
            "agent",
            "bundle",
            "provider",
            "verified",
            "p50 ms",
            "p95 ms",
            "golden",
            "drift",
            "memory MB",
            "CPU %",
            "RSS MB",
            "last error",
        ],
        [
            (
                r.device_id,
                r.slot,
                "yes" if r.online else "no",
                r.state,
                r.profile,
                r.agent_version,
                r.bundle,
                r.provider,
                "yes" if r.verified else "no",
                fmt(r.p50_ms),
                fmt(r.p95_ms),
                fmt(r.golden_agreement, 2),
                r.quality.drift_band or "-",
                fmt(r.memory_mb, 0),
                fmt(r.cpu_percent, 0),
                fmt(r.rss_mb, 0),
                r.refused or r.last_error,
            )
            for r in rows
        ],
    )
    quality_table([(_who(r), r.quality) for r in rows])
    generation_table(rows)


def _who(row: DeviceRow) -> str:
    """A row's device, and its slot when it is not the default one."""
    return row.device_id if row.slot == "default" else f"{row.device_id} {row.slot}"


def generation_table(rows: list[DeviceRow]) -> None:
    """Token figures per device serving a language model, when any does."""
    served = [(_who(r), r.generation) for r in rows if r.generation is not None]
    if served:
        print_table(
            "generation (last window)",
            ["device", "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "tokens/s", "streams", "cut", "refused"],
            [(d, fmt(g.ttft_p50_ms), fmt(g.ttft_p95_ms), fmt(g.tpot_p50_ms), fmt(g.tokens_per_s, 1), g.streams,
              g.cut, g.refused) for d, g in served],
        )  # fmt: skip


def quality_table(rows: list[tuple[str, QualityRow]]) -> None:
    """Model quality per device, when any device reports some."""
    from edgefleet.control.fleet.quality_view import any_quality, quality_cells

    if any_quality(q for _, q in rows):
        print_table("model quality", ["device", "golden (worst output)", "field accuracy", "drift (worst)",
                                      "shadow vs served"], [(d, *quality_cells(q)) for d, q in rows])  # fmt: skip


def _publish_agent_release(conn: Connection, topics: Topics, args: argparse.Namespace) -> AgentRelease:
    """Publish the agent release file and the reference the desired documents carry."""
    from edgefleet.control.publish.release import publish_release
    from edgefleet.core.messages import AgentRelease

    manifest, _, _ = publish_release(conn, topics, args.agent_release)
    downgrade = manifest.release_id if args.agent_downgrade else None
    return AgentRelease(release_id=manifest.release_id, version=manifest.version, allow_downgrade_to=downgrade)


def cmd_fleet_status(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet.status import FleetView

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


# --- fleet watch
def register_fleet_watch(verbs: argparse._SubParsersAction) -> None:
    """`fleet watch`, added beside `fleet status` by edgefleet/cli/fleet_cmd.py."""
    watch = verbs.add_parser("watch", help="follow the fleet live: a table every interval and events as they come")
    watch.add_argument("--interval", type=duration, default=2.0, help="seconds between tables")
    watch.add_argument("--count", type=int, default=0, help="stop after this many tables (0: until Ctrl-C)")
    add_broker(watch)
    add_json(watch)
    watch.set_defaults(func=cmd_fleet_watch)


def cmd_fleet_watch(args: argparse.Namespace) -> None:
    from edgefleet.control.fleet.status import FleetView
    from edgefleet.core.messages import Event, MessageError, decode
    from edgefleet.core.untrusted import safe_text, strict_json

    conn, topics = connect(args, "watch")

    def on_event(topic: str, payload: bytes, retained: bool) -> None:
        try:
            event = decode(Event, payload)
        except MessageError:
            return
        if args.json:
            print(
                json.dumps(strict_json({"type": "event", **event.model_dump(mode="json")}), allow_nan=False), flush=True
            )
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
            line = f"{event.device_id} {event.kind} {event.bundle_id or ''} {event.detail}"
            print(f"{stamp} {safe_text(line, 400)}", flush=True)  # device text: no escapes, capped

    try:
        view = FleetView(conn, topics)
        conn.subscribe(topics.all_events(), on_event)
        shown = 0
        while args.count <= 0 or shown < args.count:
            time.sleep(args.interval)
            rows = view.rows()
            if args.json:
                from edgefleet.cli.common import to_jsonable

                print(json.dumps(strict_json({"type": "fleet", "ts": time.time(), "devices": to_jsonable(rows)}),
                             allow_nan=False), flush=True)  # fmt: skip
            else:
                fleet_table(rows, title=f"fleet at {time.strftime('%H:%M:%S')}")
            shown += 1
    finally:
        conn.stop()
