"""The launcher as a process (edgefleet/launcher/process.py), with agents that misbehave as no real release can on
cue: one that never reports within the health deadline, one that reports, one that dies while committed. The
agents here are small scripts standing in for `python -m edgefleet agent` (the launcher runs each environment's
interpreter); real agents under the real launcher: tests/e2e/test_agent_self_update.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefleet.core.launcher_files import COMPLETE_NAME, launcher_dir, read_state, write_json, write_request

AGENT = """
import os, signal, sys, time
from pathlib import Path
behaviour, state_dir = sys.argv[1], Path(sys.argv[sys.argv.index("--state-dir") + 1])
with (state_dir / "ran.log").open("a") as log:
    log.write(f"{behaviour} {os.getpid()}\\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
token = os.environ.get("EDGEFLEET_LAUNCHER_TRIAL")
if behaviour == "healthy" and token:
    sys.path.insert(0, REPO)
    from edgefleet.core.launcher_files import write_health
    write_health(Path(os.environ["EDGEFLEET_LAUNCHER"]), token, {"version": "test"})
if behaviour == "notifies":
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(os.environ["NOTIFY_SOCKET"])
        watchdog = f"{os.environ.get('WATCHDOG_USEC')} {os.environ.get('WATCHDOG_PID')}"
        sock.sendall(f"READY=1\\nSTATUS=agent {watchdog}".encode())
if behaviour == "dies":
    time.sleep(0.5)
    sys.exit(3)
while True:
    time.sleep(1)
"""


def _python(path: Path, script: Path, behaviour: str) -> Path:
    """An environment's interpreter that runs the stand-in agent with `behaviour`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {script} {behaviour} "$@"\n')
    path.chmod(0o755)
    return path


def _env(state: Path, script: Path, version: str, behaviour: str) -> Path:
    env = state / "agent-envs" / version
    python = _python(env / "bin" / "python", script, behaviour)
    write_json(env / COMPLETE_NAME, {"release_id": f"r-{version}", "version": version})
    return python


def _wait(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT.replace("REPO", repr(str(Path(__file__).parents[3]))))
    started: list[subprocess.Popen[bytes]] = []

    def start(base_behaviour: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        state = tmp_path / "state"
        state.mkdir(exist_ok=True)
        base = _python(tmp_path / "base" / "bin" / "python", script, base_behaviour)
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgefleet.launcher", "--state-dir", str(state), "--deadline", "3",
             "--stop-timeout", "5", "--agent-python", str(base), "--"],
            stdout=(tmp_path / "launcher.log").open("ab"), stderr=subprocess.STDOUT, cwd=state,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)


def _ran(state: Path) -> list[str]:
    log = state / "ran.log"
    return log.read_text().split("\n")[:-1] if log.exists() else []


Start = Callable[..., "subprocess.Popen[bytes]"]


def test_a_release_that_never_reports_is_rolled_back_at_its_deadline(tmp_path: Path, launcher: Start) -> None:
    proc = launcher("healthy")
    state = tmp_path / "state"
    _wait("the base agent", lambda: len(_ran(state)) == 1)
    python = _env(state, tmp_path / "agent.py", "9.0", "hang")
    write_request(launcher_dir(state), release_id="r-9.0", version="9.0", python=str(python))
    record = _wait("the rollback", lambda: (s := read_state(launcher_dir(state))) and s.get("outcomes") and s)
    outcome = record["outcomes"][-1]  # type: ignore[index]
    assert outcome["result"] == "rolled-back" and outcome["reason"].startswith("no health report within 3 s")
    assert record["failed"] == ["r-9.0"] and record["committed"] is None  # type: ignore[index]
    _wait("the base agent again", lambda: [r.split()[0] for r in _ran(state)] == ["healthy", "hang", "healthy"])
    hung = int(_ran(state)[1].split()[1])
    assert not Path(f"/proc/{hung}").exists() or "Z" in Path(f"/proc/{hung}/stat").read_text().split(")")[1][:3]
    # The same request again changes nothing: a release that failed its gate is never tried again.
    write_request(launcher_dir(state), release_id="r-9.0", version="9.0", python=str(python))
    _wait("the request dropped", lambda: not (launcher_dir(state) / "request.json").exists())
    assert len(_ran(state)) == 3 and proc.poll() is None


def test_a_release_that_reports_is_committed_and_a_dying_committed_agent_is_restarted(
    tmp_path: Path, launcher: Start
) -> None:
    launcher("healthy")
    state = tmp_path / "state"
    _wait("the base agent", lambda: len(_ran(state)) == 1)
    python = _env(state, tmp_path / "agent.py", "9.1", "healthy")
    write_request(launcher_dir(state), release_id="r-9.1", version="9.1", python=str(python))
    record = _wait("the commit", lambda: (s := read_state(launcher_dir(state))) and s.get("committed") and s)
    assert record["committed"]["version"] == "9.1" and record["floor"] == "9.1"  # type: ignore[index]
    # The committed agent now dies (its environment's interpreter is swapped for one that exits): restarted.
    _python(python, tmp_path / "agent.py", "dies")
    os.kill(int(_ran(state)[-1].split()[1]), 9)
    _wait("two restarts of the committed agent", lambda: [r.split()[0] for r in _ran(state)].count("dies") >= 2)
    assert read_state(launcher_dir(state))["committed"]["version"] == "9.1"  # type: ignore[index]


def test_under_systemd_the_launcher_relays_its_agents_notifications_and_pings_for_a_trial(
    tmp_path: Path, launcher: Start
) -> None:
    """The shipped unit is Type=notify with WatchdogSec: systemd hears only the launcher (its main process), so the
    launcher passes its agent a socket of its own and forwards READY=1; during a trial it pings the watchdog itself."""
    import socket

    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(tmp_path / "systemd.sock"))
    systemd.settimeout(30)
    launcher("notifies", {"NOTIFY_SOCKET": str(tmp_path / "systemd.sock"), "WATCHDOG_USEC": "2000000"})
    ready = systemd.recv(4096).decode()
    assert ready.startswith("READY=1") and "STATUS=agent 2000000 None" in ready  # the agent's, with the watchdog
    state = tmp_path / "state"
    python = _env(state, tmp_path / "agent.py", "9.2", "hang")
    write_request(launcher_dir(state), release_id="r-9.2", version="9.2", python=str(python))
    _wait("the trial", lambda: (s := read_state(launcher_dir(state))) and s.get("trial"))
    pings = [systemd.recv(4096) for _ in range(3)]  # the hanging release says nothing; the launcher pings for it
    assert pings == [b"WATCHDOG=1"] * 3
    systemd.close()
