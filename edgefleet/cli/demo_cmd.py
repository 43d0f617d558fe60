"""`edgefleet demo`: the main job, on the embedded broker unless --broker is given."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edgefleet.cli.common import add_json, fmt, print_json, print_table
from edgefleet.core.untrusted import safe_text


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="convert the digits CNN, deploy it to 3 local agents, report the fleet")
    parser.add_argument("--broker", default=None, help="use this broker instead of starting the embedded one")
    parser.add_argument("--workdir", type=Path, default=None, help="keep keys, bundles and device state here")
    add_json(parser)
    parser.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from edgefleet.control.demo import run_demo

    console = Console(stderr=True)
    with console.status("starting") as status:

        def step(message: str) -> None:
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)
            status.update(message)

        result = run_demo(args.broker, args.workdir, step)
    if args.json:
        print_json(result)
    else:
        print_table(
            f"edgefleet demo: digits CNN on 3 devices ({result.seconds:.0f} s, broker {result.broker})",
            ["device", "profile", "bundle", "provider", "verified", "p50 ms", "p95 ms", "requests", "accuracy"],
            [
                (
                    d.device_id,
                    d.profile,
                    d.bundle,
                    d.provider,
                    "yes" if d.verified else "no",
                    fmt(d.p50_ms),
                    fmt(d.p95_ms),
                    d.requests,
                    fmt(d.accuracy, 4),
                )
                for d in result.devices
            ],
        )
        for d in result.devices:
            others = "; ".join(f"{p}: {why}" for p, why in d.providers_not_chosen.items())
            line = f"{d.device_id}: serves on {d.provider} ({d.provider_summary})" + (f"; {others}" if others else "")
            print(safe_text(line, 1000))  # device text
        for conv in result.conversion:
            for rejected in conv["rejected"]:
                print(f"{conv['profile']}: chose {conv['recipe']}; rejected {rejected['name']}: {rejected['rejected']}")
        print(f"work directory: {result.workdir}", file=sys.stderr)
    ok = all(d.verified and d.accuracy >= 0.95 for d in result.devices)
    return 0 if ok else 1
