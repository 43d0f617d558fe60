"""Entry point: parse, dispatch, and turn every EdgefleetError into one line and a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from edgefleet import __version__
from edgefleet.cli import agent_cmd, bundles, demo_cmd, fleet_cmd, inspect_cmd, keys, profiles_cmd, release_cmd
from edgefleet.cli.common import Parser, apply_home, selected_context
from edgefleet.cli.context import CONFIG_ENV, CONTEXT_ENV
from edgefleet.cli.control import desired as desired_cmd
from edgefleet.cli.control import registry as registry_cmd
from edgefleet.cli.control import rollout as rollout_cmd
from edgefleet.cli.control import serve as control_cmd
from edgefleet.cli.convert import command as convert_cmd
from edgefleet.cli.setup import context_command as context_cmd
from edgefleet.cli.setup import init_command as init_cmd
from edgefleet.core.errors import EdgefleetError

COMMANDS = (
    init_cmd,
    context_cmd,
    profiles_cmd,
    keys,
    inspect_cmd,
    convert_cmd,
    bundles,
    release_cmd,
    fleet_cmd,
    control_cmd,
    registry_cmd,
    desired_cmd,
    rollout_cmd,
    agent_cmd,
    demo_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="edgefleet", description="Take an ONNX model to a fleet of edge devices.")
    parser.add_argument("--version", action="version", version=f"edgefleet {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument(
        "--context", default=None, metavar="NAME",
        help=f"the context the host commands use (env {CONTEXT_ENV}; default the current-context of "
        f"${CONFIG_ENV}, else $EDGEFLEET_HOME/config.toml: see `edgefleet context`)",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command not in ("context", "init"):  # those two repair or write the context file
            apply_home(selected_context(args))  # a context's home holds the keys the command may sign with
        return int(args.func(args) or 0)
    except EdgefleetError as err:
        print(f"edgefleet: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the file system refused what the user asked for (a folder that cannot be made, ...)
        where = f"{err.filename}: " if err.filename else ""
        print(f"edgefleet: error: {where}{err.strerror or err}; check the path and its permissions", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgefleet: interrupted", file=sys.stderr)
        return 130
