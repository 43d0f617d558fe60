"""A build in a process of its own: stopped at a deadline, and its working memory back to the system when it ends.

The child is a fresh interpreter (`python -m` child.py), not a fork: the converter's process holds runtime
threads, and a spawned `multiprocessing` child would import the caller's main module again, which a user's script
without a main guard does not survive. The recipe and its inputs go in, and the passes or the error come back, as
pickles in files beside the artifact. What a builder prints goes to stderr, so that `convert --json` keeps stdout.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

from edgefleet.converter.deadline import TimeBudgetSpent
from edgefleet.converter.generative.builders.recipes import BuildOrder
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["in_own_process"]

STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL
CHILD = "edgefleet.converter.generative.builders.child"  # what the child runs (nothing imports it)


def in_own_process(build: BuildOrder, timeout_s: float | None) -> list[PassRecord]:
    """`run_recipe(build)` in a child process, stopped after `timeout_s`. Raises TimeBudgetSpent when it was stopped,
    and a RuntimeError with the build's own message when it failed."""
    out = build.out
    order, answer = out.with_name(f".{out.name}.order"), out.with_name(f".{out.name}.answer")
    out.parent.mkdir(parents=True, exist_ok=True)
    answer.unlink(missing_ok=True)
    order.write_bytes(pickle.dumps(build))
    command = [sys.executable, "-m", CHILD, str(order), str(answer)]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sys.__stderr__ or subprocess.DEVNULL)
    started = time.monotonic()  # how long it ran: neither starting the process nor stopping it counts
    try:
        code = child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise TimeBudgetSpent(  # stopped by `finally`, after the figure is taken
            f"stopped after {time.monotonic() - started:.0f} s: the time budget's share for builds ran out (a larger "
            "--time-budget lets it finish)"
        ) from None
    finally:
        _stop(child)
        order.unlink(missing_ok=True)
    try:
        status, value = pickle.loads(answer.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        raise RuntimeError(f"the build's process ended without a result (exit code {code})") from None
    finally:
        answer.unlink(missing_ok=True)
    if status != "ok":
        raise RuntimeError(value)
    assert isinstance(value, list)
    return value


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
