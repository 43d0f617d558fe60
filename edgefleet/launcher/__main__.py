"""`edgefleet-launcher --state-dir DIR [--deadline S] -- AGENT ARGS...` (what the shipped systemd unit runs)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from edgefleet.launcher.process import Launcher


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefleet-launcher",
        description="Run the edgefleet agent, and switch it to a staged agent release under a health deadline.",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="the agent's state directory")
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="seconds a new release has to pass its health gate (default 300)")  # fmt: skip
    parser.add_argument("--stop-timeout", type=float, default=30.0, help="seconds an agent gets to stop on SIGTERM")
    parser.add_argument("--agent-python", default=sys.executable,
                        help="the interpreter of the base install (default: this one)")  # fmt: skip
    parser.add_argument("agent_args", nargs=argparse.REMAINDER, help="-- then the `edgefleet agent` arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    agent_args = args.agent_args[1:] if args.agent_args[:1] == ["--"] else args.agent_args
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(message)s")
    launcher = Launcher(
        args.state_dir, agent_args, base_python=args.agent_python, deadline_s=args.deadline,
        stop_timeout_s=args.stop_timeout,
    )  # fmt: skip

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        launcher.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
