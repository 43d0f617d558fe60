"""`edgefleet keys ca|server|device|host|acl`: broker TLS credentials and the Mosquitto ACL."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_json, print_json
from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import DEFAULT_PREFIX, HOST_IDENTITY

if TYPE_CHECKING:
    from edgefleet.control.pki import CertFiles

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """`edgefleet keys ca|server|device|host|acl`: broker TLS credentials beside the signing keys."""

    ca = verbs.add_parser("ca", help="create a CA (ca.crt, ca.key) in --dir")
    ca.add_argument("--dir", type=Path, required=True, help="directory for ca.crt and ca.key")
    ca.add_argument("--name", default="edgefleet test CA", help="the CA's common name")
    ca.add_argument("--days", type=int, default=3650)
    add_json(ca)
    ca.set_defaults(func=cmd_ca)

    server = verbs.add_parser("server", help="create the broker's certificate (server.crt, server.key)")
    server.add_argument("--dir", type=Path, required=True, help="directory to write to (and of the CA by default)")
    server.add_argument(
        "--host",
        action="extend",
        nargs="+",
        required=True,
        metavar="H",
        help="DNS names or IP addresses clients dial (localhost and 127.0.0.1 are always added)",
    )
    server.add_argument("--ca-dir", type=Path, default=None, help="directory of ca.crt and ca.key (default --dir)")
    server.add_argument("--days", type=int, default=825)
    add_json(server)
    server.set_defaults(func=cmd_server)

    device = verbs.add_parser("device", help="create a device certificate whose CN is the device id (ID.crt, ID.key)")
    device.add_argument("device_id", metavar="ID")
    _client_options(device)
    device.set_defaults(func=cmd_device)

    host = verbs.add_parser("host", help=f"create the control plane's certificate (CN {HOST_IDENTITY})")
    host.add_argument("--name", default=HOST_IDENTITY, help="the CN, which is the MQTT user name in the ACL")
    _client_options(host)
    host.set_defaults(func=cmd_host)

    acl = verbs.add_parser("acl", help="write the Mosquitto ACL: each device only its own topics and bundles")
    acl.add_argument(
        "--device",
        action="append",
        default=[],
        required=True,
        metavar="ID[:GROUP,GROUP]",
        help="a device and its groups (repeat per device)",
    )
    acl.add_argument(
        "--assign",
        action="append",
        default=[],
        metavar="ID=BUNDLE",
        help="let device ID download bundle BUNDLE (repeat; a device may have several)",
    )
    acl.add_argument(
        "--host-user",
        action="append",
        default=None,
        metavar="NAME",
        help=f"user names with full access under the prefix (default {HOST_IDENTITY})",
    )
    acl.add_argument("--prefix", default=DEFAULT_PREFIX, help="MQTT topic prefix")
    acl.add_argument("--out", type=Path, required=True, help="the ACL file to (atomically) replace")
    add_json(acl)
    acl.set_defaults(func=cmd_acl)


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True, help="directory to write to (and of the CA by default)")
    parser.add_argument("--ca-dir", type=Path, default=None, help="directory of ca.crt and ca.key (default --dir)")
    parser.add_argument("--days", type=int, default=825)
    add_json(parser)


def cmd_ca(args: argparse.Namespace) -> None:
    from edgefleet.control.pki import create_ca

    files = create_ca(args.dir, common_name=args.name, days=args.days)
    _report(args, "CA", files, "keep ca.key offline; give ca.crt to the broker and every client")


def cmd_server(args: argparse.Namespace) -> None:
    from edgefleet.control.pki import create_server_cert

    files = create_server_cert(args.dir, args.host, ca_dir=args.ca_dir, days=args.days)
    _report(args, "broker", files, "for the Mosquitto TLS listener (certfile, keyfile, cafile)")


def cmd_device(args: argparse.Namespace) -> None:
    from edgefleet.control.pki import create_client_cert

    files = create_client_cert(args.dir, args.device_id, ca_dir=args.ca_dir, days=args.days)
    _report(args, f"device {args.device_id}", files, "install on the device with ca.crt")


def cmd_host(args: argparse.Namespace) -> None:
    from edgefleet.control.pki import create_client_cert

    files = create_client_cert(args.dir, args.name, ca_dir=args.ca_dir, days=args.days)
    _report(args, f"control plane ({args.name})", files, "for host commands (publish, deploy, fleet)")


def cmd_acl(args: argparse.Namespace) -> None:
    from edgefleet.control.acl import render_acl, write_acl

    devices = parse_devices(args.device)
    assignments = parse_assignments(args.assign)
    hosts = args.host_user or [HOST_IDENTITY]
    text = render_acl(devices, assignments, prefix=args.prefix, host_users=hosts)
    path = write_acl(args.out, text)
    if args.json:
        print_json(
            {
                "path": path,
                "prefix": args.prefix,
                "host_users": sorted(set(hosts)),
                "devices": {d: {"groups": devices[d], "bundles": assignments.get(d, [])} for d in sorted(devices)},
            }
        )
    else:
        print(f"wrote {path}: {len(devices)} device(s), {len(set(hosts))} host user(s); reload Mosquitto to apply")


def parse_devices(values: list[str]) -> dict[str, list[str]]:
    """`ID` or `ID:g1,g2` -> {ID: [g1, g2]}; a device given twice gets the union of its groups."""
    devices: dict[str, list[str]] = {}
    for value in values:
        device_id, _, groups = value.partition(":")
        if not device_id:
            raise UserInputError(f"--device {value!r}: expected ID or ID:GROUP,GROUP")
        known = devices.setdefault(device_id, [])
        known += [g for g in (part.strip() for part in groups.split(",")) if g and g not in known]
    return devices


def parse_assignments(values: list[str]) -> dict[str, list[str]]:
    """`ID=BUNDLE` (repeatable; `ID=B1,B2` too) -> {ID: [B1, B2]}."""
    assignments: dict[str, list[str]] = {}
    for value in values:
        device_id, sep, bundles = value.partition("=")
        if not sep or not device_id or not bundles:
            raise UserInputError(f"--assign {value!r}: expected DEVICE_ID=BUNDLE_ID")
        known = assignments.setdefault(device_id, [])
        known += [b for b in (part.strip() for part in bundles.split(",")) if b and b not in known]
    return assignments


def _report(args: argparse.Namespace, what: str, files: CertFiles, hint: str) -> None:
    from edgefleet.control.pki import certificate_cn

    if args.json:
        print_json({"cn": certificate_cn(files.cert), "cert": files.cert, "key": files.key, "ca": files.ca})
    else:
        print(f"wrote {what} certificate {files.cert} and key {files.key} (mode 0600); {hint}")
