"""`edgefleet control serve` (ingestion, rollout engine, dashboard) and `edgefleet fleet watch`.

The registry and desired-state commands are in registry_cmd.py, the rollout commands in rollout_cmd.py; all
of them work on the store (`--store URL`, default `$EDGEFLEET_STORE` or sqlite:///~/.edgefleet/control.sqlite)
that `control serve` fills and acts on.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_broker, add_json, connect, tls_files
from edgefleet.core.errors import UserInputError

if TYPE_CHECKING:
    pass

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


from edgefleet.cli.control_common import add_store, duration


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
