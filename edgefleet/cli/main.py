"""Entry point: parse, dispatch, and turn every EdgefleetError into one line and a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from edgefleet import __version__
from edgefleet.cli import (
    agent_cmd,
    bundles,
    control_cmd,
    convert_cmd,
    demo_cmd,
    desired_cmd,
    fleet_cmd,
    inspect_cmd,
    keys,
    profiles_cmd,
    registry_cmd,
    rollout_cmd,
)
from edgefleet.core.errors import EdgefleetError

COMMANDS = (
    profiles_cmd,
    keys,
    inspect_cmd,
    convert_cmd,
    bundles,
    fleet_cmd,
    control_cmd,
    registry_cmd,
    desired_cmd,
    rollout_cmd,
    agent_cmd,
    demo_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgefleet", description="Take an ONNX model to a fleet of edge devices.")
    parser.add_argument("--version", action="version", version=f"edgefleet {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except EdgefleetError as err:
        print(f"edgefleet: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgefleet: interrupted", file=sys.stderr)
        return 130
