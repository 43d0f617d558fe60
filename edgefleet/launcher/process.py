"""Running the launcher: start the committed agent, switch to a staged release under a health deadline, roll back.

One agent process at a time, the launcher's child. Its output passes through to the launcher's (the journal under
systemd), and the last lines are kept to say why a trial failed. The child dies with the launcher (Linux
PR_SET_PDEATHSIG, and systemd's control group), and its pid is recorded, so a launcher started after a `kill -9`
of the last one first ends an agent the last one left behind: two agents never share a device's identity.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from edgefleet.core.launcher_files import (
    COMPLETE_NAME,
    ENV_LAUNCHER,
    ENV_TRIAL,
    HEALTH_DIR,
    REQUEST_NAME,
    envs_dir,
    health_path,
    launcher_dir,
    read_json,
    read_request,
    read_state,
    write_json,
)
from edgefleet.launcher.notify import NotifyRelay
from edgefleet.launcher.state import (
    Environment,
    LauncherState,
    begin_trial,
    commit,
    request_problem,
    resume_after_restart,
    roll_back,
)

log = logging.getLogger("edgefleet.launcher")

CHILD_NAME = "child.json"
TAIL_LINES = 40
MAX_BACKOFF_S = 30.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): a recycled pid has another. None when
    there is no such process, or only its zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


class Child:
    """One agent process; its output copied to ours, the last lines kept."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.started = time.monotonic()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        # In the state directory: `python -m` puts the working directory first on the path, and a checkout there
        # would shadow the environment's own edgefleet.
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=_die_with_parent
        )
        self._reader = threading.Thread(target=self._copy, name="agent-output", daemon=True)
        self._reader.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            text = line.decode("utf-8", "replace").strip()
            if text:
                self.tail.append(text)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout_s: float) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("agent %d did not stop within %g s: killing it", self.pid, timeout_s)
                self.proc.kill()
        code = self.proc.wait()
        self._reader.join(2.0)
        return code

    def last_error(self) -> str:
        """The last log line that reads like an error (else the last line), cut to 300 characters."""
        self._reader.join(1.0)
        lines = list(self.tail)
        for line in reversed(lines):
            if any(word in line for word in ("Error", "error", "ERROR", "refuse", "Traceback")):
                return line[:300]
        return lines[-1][:300] if lines else "no output"


class Launcher:
    def __init__(
        self,
        state_dir: Path,
        agent_args: list[str],
        *,
        base_python: str,
        deadline_s: float = 300.0,
        stop_timeout_s: float = 30.0,
        poll_s: float = 0.2,
    ) -> None:
        self.state_dir = state_dir
        self.dir = launcher_dir(state_dir)
        self.agent_args = agent_args
        self.base = Environment("", "base", base_python)
        self.deadline_s, self.stop_timeout_s, self.poll_s = deadline_s, stop_timeout_s, poll_s
        self.stopping = threading.Event()
        self._backoff = 1.0
        self.relay: NotifyRelay | None = None

    # --- state on disk (written whole before it is acted on)
    def load(self) -> LauncherState:
        return LauncherState.from_dict(read_state(self.dir))

    def save(self, state: LauncherState) -> None:
        write_json(self.dir / "state.json", state.to_dict())

    # --- the loop
    def run(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.relay = NotifyRelay(self.dir)
        self._end_stray()
        state = self.load()
        if state.trial is not None:
            state = resume_after_restart(state, uuid.uuid4().hex)
            self.save(state)
            log.warning("a trial was interrupted by a restart: %s",
                        f"trying {state.trial.env.release_id} again" if state.trial else "rolled back")  # fmt: skip
        child: Child | None = None
        while not self.stopping.is_set():
            if state.trial is not None:
                state, child = self._trial(state)
                continue
            if child is None or child.poll() is not None:
                child = self._spawn(state.committed or self.base, token=None)
            state, child = self._serve(state, child)
        if child is not None:
            child.stop(self.stop_timeout_s)
        (self.dir / CHILD_NAME).unlink(missing_ok=True)
        return 0

    def stop(self) -> None:
        self.stopping.set()

    def _spawn(self, env: Environment, *, token: str | None) -> Child:
        cmd = [env.python, "-m", "edgefleet", "agent", "--state-dir", str(self.state_dir), *self.agent_args]
        environ = {k: v for k, v in os.environ.items() if k not in (ENV_TRIAL, "NOTIFY_SOCKET", "WATCHDOG_PID")}
        environ.pop("WATCHDOG_USEC", None)
        if self.relay is not None:
            environ.update(self.relay.child_env())
            self.relay.child_started()
        environ[ENV_LAUNCHER] = str(self.dir)
        if token is not None:
            environ[ENV_TRIAL] = token
        child = Child(cmd, environ, self.state_dir)
        write_json(self.dir / CHILD_NAME, {"pid": child.pid, "start_time": _start_time(child.pid)})
        log.info("started agent %s (pid %d)%s", env.version or "(base install)", child.pid,
                 " on trial" if token else "")  # fmt: skip
        return child

    def _cover(self, *, always: bool = False) -> None:
        if self.relay is not None:
            self.relay.cover(always=always)

    def _end_stray(self) -> None:
        """An agent the last launcher left running (it was killed with -9 where no death signal reached it)."""
        record = read_json(self.dir / CHILD_NAME)
        if not record or not isinstance(record.get("pid"), int):
            return
        pid = record["pid"]
        if _start_time(pid) is None or _start_time(pid) != record.get("start_time"):
            return
        log.warning("ending agent %d left by the previous launcher", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while _start_time(pid) == record.get("start_time") and time.monotonic() < deadline:
            time.sleep(0.05)

    def _serve(self, state: LauncherState, child: Child) -> tuple[LauncherState, Child | None]:
        """The committed agent runs until a hand-over request starts a trial, it exits, or the launcher stops."""
        while not self.stopping.wait(self.poll_s):
            self._cover()
            request = read_request(self.dir)
            if request is not None:
                started = self._take_request(state, request, child)
                if started is not None:
                    return started, None
            code = child.poll()
            if code is not None:
                lived = time.monotonic() - child.started
                self._backoff = 1.0 if lived > 60 else min(MAX_BACKOFF_S, self._backoff * 2)
                log.error("agent exited with code %s (%s); starting it again in %g s", code, child.last_error(),
                          self._backoff)  # fmt: skip
                until = time.monotonic() + self._backoff
                while time.monotonic() < until and not self.stopping.wait(min(self.poll_s, self._backoff)):
                    self._cover(always=True)  # no agent runs: the launcher answers for the restart
                return state, None
        return state, child

    def _take_request(self, state: LauncherState, request: dict[str, object], child: Child) -> LauncherState | None:
        try:
            env = Environment(str(request["version"]), str(request["release_id"]), str(request["python"]))
        except KeyError:
            env = None
        problem = request_problem(state, env) if env is not None else "malformed request"
        if problem is None and env is not None:
            problem = self._env_problem(env)
        if problem is not None or env is None:
            log.warning("hand-over request not taken: %s", problem)
            (self.dir / REQUEST_NAME).unlink(missing_ok=True)
            return None
        log.info("switching to %s: stopping the running agent", env.release_id)
        child.stop(self.stop_timeout_s)
        state = begin_trial(state, env, uuid.uuid4().hex)
        self.save(state)  # the trial is on disk before the request goes: a crash between retries the trial
        (self.dir / REQUEST_NAME).unlink(missing_ok=True)
        return state

    def _env_problem(self, env: Environment) -> str | None:
        python = Path(os.path.abspath(env.python))  # a venv's python is a link out of it: not resolved
        root = Path(os.path.abspath(envs_dir(self.state_dir)))
        if not python.is_relative_to(root) or not python.is_file():
            return f"{env.python} is not an agent environment under {root}"
        if not (python.parent.parent / COMPLETE_NAME).is_file():
            return f"the environment of {env.release_id} was not built completely"
        return None

    def _trial(self, state: LauncherState) -> tuple[LauncherState, Child | None]:
        """Run the release on trial until its health report (commit), its exit or the deadline (roll back)."""
        trial = state.trial
        assert trial is not None
        child = self._spawn(trial.env, token=trial.token)
        deadline = time.monotonic() + self.deadline_s
        report = health_path(self.dir, trial.token)
        while True:
            self._cover(always=True)
            if self.stopping.wait(self.poll_s):
                child.stop(self.stop_timeout_s)  # the trial stays on disk: the next start resumes it
                return state, None
            health = read_json(report)
            if health is not None and health.get("token") == trial.token:
                state = commit(state)
                self.save(state)
                log.info("committed %s: it passed its health gate", trial.env.release_id)
                self._prune(state)
                return state, child
            code = child.poll()
            if code is not None:
                why = f"the new agent exited with code {code} before passing its health gate: {child.last_error()}"
                return self._rolled_back(state, why), None
            if time.monotonic() > deadline:
                child.stop(self.stop_timeout_s)
                why = f"no health report within {self.deadline_s:g} s (last output: {child.last_error()})"
                return self._rolled_back(state, why), None

    def _rolled_back(self, state: LauncherState, reason: str) -> LauncherState:
        assert state.trial is not None
        release = state.trial.env.release_id
        state = roll_back(state, reason)
        self.save(state)
        log.error("rolled back %s: %s", release, reason)
        self._prune(state)
        return state

    def _prune(self, state: LauncherState) -> None:
        """Environments no state names go (never one being built: no complete mark yet), and old health reports."""
        keep = {Path(e.python).parent.parent.name for e in (state.committed, state.previous) if e is not None}
        root = envs_dir(self.state_dir)
        for env in root.iterdir() if root.is_dir() else []:
            if env.is_dir() and env.name not in keep and (env / COMPLETE_NAME).exists():
                shutil.rmtree(env, ignore_errors=True)
        health = self.dir / HEALTH_DIR
        for report in health.iterdir() if health.is_dir() else []:
            report.unlink(missing_ok=True)


__all__ = ["Child", "Launcher"]
