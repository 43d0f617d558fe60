"""What a session fixture makes that is costly and only read afterwards, made once for the whole run, on one xdist
worker for all of them (support/parallel_runs.py says how the suite runs in parallel)."""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(directory)` once for the whole run. Without xdist: in a fresh temporary directory, as a session
    fixture would. Under xdist: the first worker to ask makes it in the run's own temporary directory (the parent of
    every worker's), under a lock, and leaves the result pickled there; the others wait on the lock and read it. A
    `make` that fails leaves nothing behind: the next worker that asks tries again (and fails as loudly)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(tmp_path_factory.mktemp(name))
    run = tmp_path_factory.getbasetemp().parent  # .../pytest-N/popen-gwK: pytest-N is this run's, shared
    directory, result = run / f"shared-{name}", run / f"shared-{name}.pickle"
    with (run / f"shared-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            made: T = pickle.loads(result.read_bytes())
            return made
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        value = make(directory)
        result.write_bytes(pickle.dumps(value))
        return value
