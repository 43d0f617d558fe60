"""`edgefleet init DIR`: a whole secure deployment in one directory (edgefleet/control/deployment), and a context
for the host commands that points at it."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgefleet.cli import context as context_file
from edgefleet.cli.common import add_json, print_json
from edgefleet.core.topics import DEFAULT_PREFIX


def register(sub: argparse._SubParsersAction) -> None:
    from edgefleet.control.deployment.spec import DEFAULT_EDGEFLEET, DEFAULT_MOSQUITTO

    parser = sub.add_parser(
        "init",
        help="write a secure deployment in a new directory: keys, CA and certificates, broker rights, "
        "mosquitto.conf, systemd units, compose file, and a context for the host commands",
        description="Writes DIR (see docs/getting-started.md). Then: `cd DIR && mosquitto -c mosquitto.conf`, "
        "`edgefleet control serve`, one `edgefleet agent` per device with the files in DIR/devices/ID/.",
    )  # fmt: skip
    parser.add_argument("directory", type=Path, metavar="DIR", help="a new (or empty) directory")
    parser.add_argument(
        "--device", action="append", default=[], metavar="ID[:GROUP,GROUP]",
        help="a device to enroll on the broker, with its groups (repeatable); more later with `edgefleet keys "
        "device` and `edgefleet keys enroll`",
    )  # fmt: skip
    parser.add_argument(
        "--listen", default="127.0.0.1", metavar="ADDRESS",
        help="the broker's listening address ('all': every interface); devices elsewhere need one they can reach",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8883, help="the broker's TLS port")
    parser.add_argument(
        "--host", action="append", default=[], metavar="NAME",
        help="a DNS name or address clients dial, for the broker certificate (repeatable; localhost and "
        "127.0.0.1 are always in it); the first is the devices' broker URL",
    )  # fmt: skip
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="MQTT topic prefix")
    parser.add_argument("--name", default=None, help="the context's name (default: DIR's name)")
    parser.add_argument(
        "--install-path", type=Path, default=None,
        help="where DIR will be on the machine that runs it, for the systemd units (default: DIR, absolute)",
    )  # fmt: skip
    parser.add_argument("--broker-user", default="mosquitto", help="the user Mosquitto switches to when root starts it")
    parser.add_argument("--dynsec-plugin", default=None, help="the dynamic-security plugin (default: found here)")
    parser.add_argument("--mosquitto", default=DEFAULT_MOSQUITTO, help="the mosquitto binary, for the broker unit")
    parser.add_argument("--edgefleet", default=DEFAULT_EDGEFLEET, help="the edgefleet command, for the units")
    parser.add_argument("--dashboard", default="127.0.0.1:8780", help="the control plane's dashboard HOST:PORT")
    parser.add_argument(
        "--no-context", action="store_true",
        help=f"do not add the context to ${context_file.CONFIG_ENV} (else $EDGEFLEET_HOME/config.toml) nor make "
        "it current",
    )  # fmt: skip
    add_json(parser)
    parser.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> None:
    from edgefleet.cli.credentials import parse_devices
    from edgefleet.control.deployment import DeploymentSpec, create_deployment, default_dynsec_plugin

    directory: Path = args.directory
    name = args.name or directory.resolve().name
    spec = DeploymentSpec(
        directory=directory,
        devices=parse_devices(args.device),
        install_path=args.install_path,
        listen=args.listen,
        port=args.port,
        hosts=tuple(args.host),
        prefix=args.prefix,
        broker_user=args.broker_user,
        dynsec_plugin=args.dynsec_plugin or default_dynsec_plugin(),
        mosquitto=args.mosquitto,
        edgefleet=args.edgefleet,
        dashboard=args.dashboard,
        context_name=name,
    )
    created = create_deployment(spec)
    user_file = None
    if not args.no_context:
        user_file = _add_context(name, directory / "config.toml")
    if args.json:
        print_json(
            {
                "directory": directory.resolve(),
                "context": name,
                "context_file": user_file,
                "broker": spec.local_url,
                "broker_user": created.broker_user,
                "devices": dict(spec.devices),
                "files": created.files,
                "notes": created.notes,
            }
        )
        return
    where = directory.resolve()
    print(f"wrote a deployment in {where} (broker {spec.local_url}, devices: {', '.join(spec.devices) or 'none'})")
    if user_file:
        print(f"context {name} added to {user_file} and made current (`edgefleet context show`)")
    print(f"  keep {where}/keys/root.key and {where}/pki/ca.key offline once the fleet runs")
    for note in created.notes:
        print(f"  note: {note}")
    print(f"next: (cd {directory} && mosquitto -c mosquitto.conf), then `edgefleet control serve`")


def _add_context(name: str, deployment_file: Path) -> Path:
    """The deployment's context, with absolute paths, in the user's context file, made current."""
    own = context_file.load(deployment_file).contexts[name]
    context = context_file.absolute(own, deployment_file.parent)
    path = context_file.config_path()
    config = context_file.load(path)
    contexts = {**config.contexts, name: context}
    context_file.save(config.model_copy(update={"contexts": contexts, "current_context": name}), path)
    return path
