"""`edgefleet keys ca|server|device|host|dynsec|enroll|acl`: broker TLS credentials and broker rights.

`dynsec` writes the first configuration of Mosquitto's dynamic-security plugin (what `edgefleet init` writes);
`enroll` adds a device or a control-plane identity to a running broker; `acl` is the static alternative for a
broker without the plugin (rights then do not follow deployments: re-run it and reload Mosquitto).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_broker, add_json, connect, print_json
from edgefleet.cli.control.common import add_store
from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import DEFAULT_PREFIX, HOST_IDENTITY

if TYPE_CHECKING:
    from edgefleet.control.credentials.pki import CertFiles

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

    dyn = verbs.add_parser(
        "dynsec", help="write the first dynamic-security plugin configuration: host users, devices and their groups"
    )
    _fleet_options(dyn, devices_required=False)
    dyn.set_defaults(func=cmd_dynsec)

    enroll = verbs.add_parser(
        "enroll", help="add a device (or, with --host, a control-plane identity) to a running broker"
    )
    enroll.add_argument(
        "identity", metavar="ID", help="the certificate CN: a device id, or a host identity with --host"
    )
    enroll.add_argument("--group", action="append", default=[], help="a registry group of the device (repeatable)")
    enroll.add_argument("--host", action="store_true", help="a control-plane identity (role edgefleet-host)")
    add_broker(enroll)
    add_json(enroll)
    enroll.set_defaults(func=cmd_enroll)

    revoke = verbs.add_parser(
        "revoke-device",
        help="a stolen device certificate: disconnect it, take every broker right from its CN, mark it revoked",
    )
    revoke.add_argument("identity", metavar="ID", help="the device id (its certificate's CN)")
    revoke.add_argument("--crl", type=Path, default=None, help="also add its certificate to this CRL (needs --ca-dir)")
    revoke.add_argument("--ca-dir", type=Path, default=None, help="directory of ca.crt and ca.key, to sign the CRL")
    revoke.add_argument("--device-cert", type=Path, default=None, help="the stolen certificate (default CA_DIR/ID.crt)")
    add_store(revoke)
    add_broker(revoke)
    add_json(revoke)
    revoke.set_defaults(func=cmd_revoke_device)

    crl = verbs.add_parser("crl", help="create or extend the broker's certificate revocation list (crlfile)")
    crl.add_argument("--ca-dir", type=Path, required=True, help="directory of ca.crt and ca.key")
    crl.add_argument("--out", type=Path, required=True, help="the CRL file (re-signed in place when it exists)")
    crl.add_argument("--revoke", type=Path, action="append", default=[], help="a certificate to revoke (repeatable)")
    crl.add_argument("--days", type=int, default=3650, help="validity: a broker refuses every client past it")
    add_json(crl)
    crl.set_defaults(func=cmd_crl)

    acl = verbs.add_parser("acl", help="write a static Mosquitto ACL (a broker without the dynamic-security plugin)")
    _fleet_options(acl)
    acl.set_defaults(func=cmd_acl)


def _fleet_options(acl: argparse.ArgumentParser, *, devices_required: bool = True) -> None:
    acl.add_argument(
        "--device",
        action="append",
        default=[],
        required=devices_required,
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
    acl.add_argument("--out", type=Path, required=True, help="the file to write")
    add_json(acl)


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True, help="directory to write to (and of the CA by default)")
    parser.add_argument("--ca-dir", type=Path, default=None, help="directory of ca.crt and ca.key (default --dir)")
    parser.add_argument("--days", type=int, default=825)
    add_json(parser)


def cmd_ca(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.pki import create_ca

    files = create_ca(args.dir, common_name=args.name, days=args.days)
    _report(args, "CA", files, "keep ca.key offline; give ca.crt to the broker and every client")


def cmd_server(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.pki import create_server_cert

    files = create_server_cert(args.dir, args.host, ca_dir=args.ca_dir, days=args.days)
    _report(args, "broker", files, "for the Mosquitto TLS listener (certfile, keyfile, cafile)")


def cmd_device(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.pki import create_client_cert

    files = create_client_cert(args.dir, args.device_id, ca_dir=args.ca_dir, days=args.days)
    _report(args, f"device {args.device_id}", files, "install on the device with ca.crt")


def cmd_host(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.pki import create_client_cert

    files = create_client_cert(args.dir, args.name, ca_dir=args.ca_dir, days=args.days)
    _report(args, f"control plane ({args.name})", files, "for host commands (publish, deploy, fleet)")


def cmd_acl(args: argparse.Namespace) -> None:
    from edgefleet.control.rights.acl import render_acl, write_acl

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


def cmd_dynsec(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.pki import write_new_text
    from edgefleet.control.rights.dynsec import render_config

    devices = parse_devices(args.device)
    assignments = parse_assignments(args.assign)
    hosts = args.host_user or [HOST_IDENTITY]
    path = write_new_text(args.out, render_config(devices, assignments, prefix=args.prefix, host_users=hosts))
    if args.json:
        print_json({"path": path, "prefix": args.prefix, "host_users": sorted(set(hosts)), "devices": devices})
    else:
        print(
            f"wrote {path}: {len(devices)} device(s), {len(set(hosts))} host user(s); it is the plugin's "
            "plugin_opt_config_file (the broker rewrites it from now on)"
        )


def cmd_enroll(args: argparse.Namespace) -> None:
    from edgefleet.control.rights.dynsec import HOST_ROLE
    from edgefleet.control.rights.sync import DynsecClient, DynsecRights, probe_dynsec

    conn, topics = connect(args, "enroll")
    try:
        client = DynsecClient(conn)
        if not probe_dynsec(client):
            raise UserInputError(
                f"the broker at {args.broker} did not answer on $CONTROL/dynamic-security/v1 (no plugin, or this "
                "certificate lacks the edgefleet-host role)"
            )
        if args.host:
            client.check([{"command": "createClient", "username": args.identity, "roles": [{"rolename": HOST_ROLE}]}])
        else:
            DynsecRights(conn, topics, client).enroll(args.identity, args.group)
    finally:
        conn.stop()
    role = "control plane" if args.host else "device"
    if args.json:
        print_json({"identity": args.identity, "role": role, "groups": args.group})
    else:
        print(f"enrolled {role} {args.identity} on the broker")


def cmd_revoke_device(args: argparse.Namespace) -> None:
    from edgefleet.cli.control.common import open_from
    from edgefleet.control.rights.revoke import mark_revoked, revoke_on_broker
    from edgefleet.control.rights.sync import DynsecClient

    if args.crl is not None and args.ca_dir is None:
        raise UserInputError("--crl needs --ca-dir (the CA's key signs the CRL)")
    conn, _ = connect(args, "revoke")
    try:
        broker = revoke_on_broker(DynsecClient(conn), args.identity)
    finally:
        conn.stop()
    crl = None
    if args.crl is not None:
        from edgefleet.control.credentials.crl import write_crl
        from edgefleet.control.credentials.pki import certificate_cn

        cert = args.device_cert or args.ca_dir / f"{args.identity}.crt"
        if certificate_cn(cert) != args.identity:
            raise UserInputError(f"{cert} is the certificate of {certificate_cn(cert)!r}, not {args.identity!r}")
        write_crl(args.ca_dir, args.crl, [cert])
        crl = str(args.crl)
    store = open_from(args)
    try:
        registry = mark_revoked(store, args.identity)
    finally:
        store.close()
    if args.json:
        print_json({"identity": args.identity, "broker": broker, "registry": registry, "crl": crl})
    else:
        print(f"revoked device {args.identity}: broker: {broker}; registry: {registry}")
        if crl:
            print(f"added its certificate to {crl}: install it as the broker's crlfile, then reload Mosquitto")
        print("a replacement device needs a new device id and certificate (this CN stays revoked)")


def cmd_crl(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.crl import write_crl

    serials = write_crl(args.ca_dir, args.out, args.revoke, days=args.days)
    if args.json:
        print_json({"path": args.out, "revoked": [f"{s:x}" for s in serials]})
    else:
        print(f"wrote {args.out}: {len(serials)} revoked certificate(s); reload Mosquitto to apply (SIGHUP)")


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
    from edgefleet.control.credentials.pki import certificate_cn

    if args.json:
        print_json({"cn": certificate_cn(files.cert), "cert": files.cert, "key": files.key, "ca": files.ca})
    else:
        print(f"wrote {what} certificate {files.cert} and key {files.key} (mode 0600); {hint}")
