"""`edgefleet convert … --measure-on DEVICE|GROUP`: the options and the connection of the benchmark farm
(edgefleet/control/farm/service.py `FleetFarm`, edgefleet.converter.search's `Farm`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_setting, tls_files

if TYPE_CHECKING:
    from edgefleet.control.farm.service import FleetFarm


def add_farm_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    farm = parser.add_argument_group("measuring on devices (the fleet as the benchmark farm)")
    farm.add_argument(
        "--measure-on",
        default=None,
        metavar="DEVICE|GROUP",
        help="choose each profile's recipe by what the online devices of this id or group that run the profile "
        "measure (median over the devices of their p50), instead of this host's timing",
    )
    farm.add_argument("--measure-timeout", type=float, default=300.0, metavar="SECONDS", help="wait this long")
    farm.add_argument("--measure-cpu-share", type=float, default=0.5, help="share of a device's cores (0-1]")
    farm.add_argument("--measure-calls", type=int, default=50, help="individually timed calls per candidate")
    for dest in ("broker", "prefix", "protocol", "tls_ca", "tls_cert"):
        add_setting(farm, dest)
    add_setting(farm, "tls_key", "--cert-key")  # --key is the bundle key here
    farm.add_argument(
        "--broker-rights",
        choices=["auto", "dynsec", "none"],
        default="auto",
        help="let the devices read the candidates on a managed broker (dynsec) for the run",
    )
    farm.add_argument(
        "--store",
        default=env("EDGEFLEET_STORE"),
        help="control-plane store URL, for the host registry's groups and profiles (env EDGEFLEET_STORE; "
        "default: the devices' status)",
    )


@contextmanager
def farm_from(args: argparse.Namespace) -> Iterator[FleetFarm | None]:
    """The farm the options ask for (None without --measure-on), connected for the conversion's length."""
    if not args.measure_on:
        yield None
        return
    from edgefleet.control.farm.service import FleetFarm
    from edgefleet.control.rights.sync import open_rights
    from edgefleet.control.store import open_store
    from edgefleet.core.errors import UserInputError
    from edgefleet.core.mqtt.connection import Connection
    from edgefleet.core.topics import Topics

    if not 0 < args.measure_cpu_share <= 1:
        raise UserInputError(f"--measure-cpu-share {args.measure_cpu_share}: a share in (0, 1]")
    tls = tls_files(args)
    conn = Connection(args.broker, f"edgefleet-farm-{os.getpid()}", protocol=args.protocol, tls=tls)
    conn.start(wait=10.0)
    store = open_store(args.store) if args.store else None
    try:
        topics = Topics(args.prefix)
        farm = FleetFarm(
            conn, topics, args.measure_on, store=store, rights=open_rights(conn, topics, args.broker_rights),
            timeout_s=args.measure_timeout, cpu_share=args.measure_cpu_share, calls=args.measure_calls,
        )  # fmt: skip
        farm.check()  # an unknown device or group fails now, not after the conversion
        yield farm
    finally:
        if store is not None:
            store.close()
        conn.stop()


def print_farm(profile: str, farm: dict[str, object] | None) -> None:
    """Where and when the chosen recipe was measured, one line per device."""
    devices = farm.get("devices") if farm else None
    for d in devices if isinstance(devices, list) else []:
        print(
            f"  {profile}: measured on {d['device_id']} ({d['profile']}, {d['provider']}, {d['threads']} threads, "
            f"{_num(d['cpu_share'], 2)} of its cores) at {d['measured_at']}: p50 {_num(d['p50_ms'], 4)} ms, "
            f"p90 {_num(d['p90_ms'], 4)} ms, load {_num(d['load_ms'], 0)} ms, peak {_num(d['peak_rss_mb'], 0)} MB"
        )


def _num(value: object, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"
