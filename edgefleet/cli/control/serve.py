"""`edgefleet control serve`: ingestion, rollout engine, dashboard.

The registry and desired-state commands are in registry_cmd.py and desired_cmd.py, the rollout commands in
rollout_cmd.py; all of them work on the store (`--store URL`, default `$EDGEFLEET_STORE` or sqlite:///~/.edgefleet/control.sqlite)
that `control serve` fills and acts on.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from edgefleet.cli.common import add_broker, tls_files
from edgefleet.cli.control.audit import register_audit
from edgefleet.cli.control.common import add_store, duration
from edgefleet.cli.control.status import register_status
from edgefleet.cli.control.token import register_token
from edgefleet.core.errors import UserInputError

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


def register(sub: argparse._SubParsersAction) -> None:
    control = sub.add_parser("control", help="the control plane: ingestion, rollouts, dashboard")
    verbs = control.add_subparsers(dest="verb", required=True, metavar="VERB")
    serve = verbs.add_parser("serve", help="ingest telemetry, run rollouts and serve the dashboard until Ctrl-C")
    add_broker(serve, identity="control")
    add_store(serve)
    serve.add_argument("--http", default="127.0.0.1:8780", help="dashboard address HOST:PORT, or 'off'")
    serve.add_argument("--http-cert", type=Path, help="serve the dashboard over HTTPS with this certificate chain")
    serve.add_argument("--http-key", type=Path, help="the private key of --http-cert")
    serve.add_argument(
        "--trusted-proxy", action="append", default=[], metavar="ADDRESS",
        help="a reverse proxy (address or network) whose X-Forwarded-For names the dashboard's client (repeatable); "
        "from any other peer the header is ignored and the throttle and the audit use the peer's address",
    )  # fmt: skip
    serve.add_argument("--instance", default="main", help="this process's name (MQTT client id, lease holder)")
    serve.add_argument("--share-group", default="edgefleet", help="shared-subscription group; '' subscribes plainly")
    serve.add_argument(
        "--session-expiry", type=duration, default=600.0,
        help="how long the broker keeps this instance's session (and queues its share of telemetry) while it is "
        "down; restart under the same --instance within it and nothing is lost; 0 hands the share to the others",
    )  # fmt: skip
    serve.add_argument(
        "--broker-rights", choices=["auto", "dynsec", "none"], default="auto",
        help="grant devices the topics of what they are deployed: dynsec (Mosquitto's dynamic-security plugin), "
        "none, or auto (dynsec when connecting with a TLS client certificate and the plugin answers)",
    )  # fmt: skip
    serve.add_argument(
        "--retained-sweep", type=duration, default=10.0,
        help="with managed broker rights: clear retained messages devices leave outside their status this often",
    )  # fmt: skip
    serve.add_argument("--no-engine", action="store_true", help="ingest only; never run rollouts")
    serve.add_argument("--no-ingest", action="store_true", help="run rollouts and the dashboard only")
    serve.add_argument("--tick", type=duration, default=1.0, help="rollout engine period")
    serve.add_argument(
        "--lease-ttl", type=duration, default=10.0,
        help="engine lease length: another instance takes the rollouts over within lease-ttl + tick of this one dying",
    )  # fmt: skip
    serve.add_argument("--raw-retention", type=duration, default=6 * 3600.0, help="keep raw telemetry this long")
    serve.add_argument("--bucket", type=duration, default=60.0, help="downsampled bucket width")
    serve.add_argument("--rollup-retention", type=duration, default=30 * 86400.0, help="keep buckets this long")
    serve.add_argument("--event-retention", type=duration, default=30 * 86400.0, help="keep events this long")
    serve.add_argument(
        "--device-store-mb", type=float, default=256.0,
        help="retention by bytes: a device holding more than this in the store (its reports, quality rows and "
        "events) loses its oldest rows, measured every 10 min; 0: no cap",
    )  # fmt: skip
    serve.set_defaults(func=cmd_control_serve)
    register_token(verbs)
    register_audit(verbs)
    register_status(verbs)


# --- control serve
def cmd_control_serve(args: argparse.Namespace) -> None:
    from edgefleet.control.dashboard.auth import bind_warning
    from edgefleet.control.server import ControlConfig, ControlPlane
    from edgefleet.control.store.url import redacted
    from edgefleet.core.topics import check_segment

    host, port = _http(args.http)
    if (args.http_cert is None) != (args.http_key is None):
        raise UserInputError("--http-cert and --http-key go together")
    tls = (str(args.http_cert), str(args.http_key)) if args.http_cert else None
    try:
        check_segment("instance name", args.instance)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    tls_ = tls_files(args)
    config = ControlConfig(
        broker=args.broker, store_url=args.store, prefix=args.prefix, protocol=args.protocol, tls=tls_,
        instance=args.instance, share_group=args.share_group or None, ingest=not args.no_ingest,
        engine=not args.no_engine, http_host=host, http_port=port, http_tls=tls, tick_s=args.tick,
        trusted_proxies=tuple(args.trusted_proxy),
        lease_ttl_s=args.lease_ttl,
        raw_retention_s=args.raw_retention, bucket_s=args.bucket, rollup_retention_s=args.rollup_retention,
        event_retention_s=args.event_retention, session_expiry_s=int(args.session_expiry),
        device_store_bytes=int(args.device_store_mb * 2**20),
        broker_rights=args.broker_rights, retained_sweep_s=args.retained_sweep,
    )  # fmt: skip
    warning = bind_warning(host, port, tls=tls is not None) if port is not None else None
    if warning:
        print(f"\n{'!' * 100}\n{warning}\n{'!' * 100}\n", file=sys.stderr, flush=True)
    plane = ControlPlane(config).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: plane.request_stop())
    parts = [f"control plane {args.instance} on {args.broker}, store {redacted(args.store)}"]
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
