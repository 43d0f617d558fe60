"""The measuring worker's process, seen from the agent: start it, hand it its job, read its lines, kill it.

A worker imports Python's runtime stack (pydantic, numpy, ONNX Runtime, the optional runtimes its providers need)
before it reads its job, which is most of what a cold provider selection costs on a small model. So a worker can be
started before its job exists (`prestart`, when an offer is accepted: its imports overlap the download) and kept in
one slot until a selection takes it. A prestarted worker that nobody takes ends by itself after IDLE_EXIT_S, or
when the agent exits (its stdin closes); `discard` ends it at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

IDLE_EXIT_S = 600.0  # a prestarted worker that gets no job in this time exits


class WorkerUnavailable(RuntimeError):
    """The worker could not start (the agent then measures in its own process)."""


class WorkerProcess:
    """One worker process and the lines it has written (its "ready" line sets `ready` instead)."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "edgefleet.agent.runtime.selection.worker"]
        if preload:
            command += ["--preload", ",".join(preload)]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C at the agent's terminal stops the agent, which then kills it
        )
        self.preload = tuple(preload)
        self.ready = threading.Event()  # imports done, waiting for its job
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, name="selection worker output", daemon=True).start()

    def send(self, job: BaseModel) -> bool:
        """Hand the worker its job; False when it is gone already (a fresh one must be started)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(job.model_dump_json().encode())
            self.proc.stdin.close()
        except OSError:  # BrokenPipeError: the worker exited (idle, or its imports crashed)
            self.kill()
            return False
        return True

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "ready":
                self.ready.set()
                continue
            self.lines.put(record)
        self.lines.put(None)  # end of output: the worker exited

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next record; None when the worker exited; TimeoutError when it missed the deadline."""
        try:
            return self.lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            raise TimeoutError from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


_SLOT_LOCK = threading.Lock()
_SLOT: list[WorkerProcess] = []  # at most one prestarted worker


def prestart(preload: Sequence[str] = ()) -> WorkerProcess:
    """Start a worker now (importing the runtimes of `preload`), kept until `take` or `discard`."""
    worker = WorkerProcess(preload)
    with _SLOT_LOCK:
        stale, _SLOT[:] = list(_SLOT), [worker]
    for old in stale:
        old.kill()
    return worker


def take() -> WorkerProcess | None:
    """The prestarted worker, if one is waiting and alive (it leaves the slot)."""
    with _SLOT_LOCK:
        found, _SLOT[:] = list(_SLOT), []
    for worker in found:
        if worker.alive():
            return worker
        worker.kill()
    return None


def discard() -> None:
    """End a prestarted worker that no selection took."""
    with _SLOT_LOCK:
        found, _SLOT[:] = list(_SLOT), []
    for worker in found:
        worker.kill()


def start(job: BaseModel) -> WorkerProcess:
    """A worker running `job`: the prestarted one when there is one, else a new process."""
    worker = take()
    if worker is not None and worker.send(job):
        return worker
    worker = WorkerProcess()
    worker.send(job)  # a worker that died before reading it shows in its exit code
    return worker
