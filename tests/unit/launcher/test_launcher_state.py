"""The launcher's state machine (edgefleet/launcher/state.py): commit only after the health gate, roll back on
failure and never retry that release, resume an interrupted trial at most MAX_ATTEMPTS times, and read back from
disk exactly what was written (the launcher writes each state whole before it acts on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgefleet.core.launcher_files import read_state, write_json
from edgefleet.launcher.state import (
    MAX_ATTEMPTS,
    Environment,
    LauncherState,
    begin_trial,
    commit,
    request_problem,
    resume_after_restart,
    roll_back,
)

V2 = Environment("0.2.0", "agent-0.2.0-py311-linux-x86_64", "/state/agent-envs/0.2.0/bin/python")
V3 = Environment("0.3.0", "agent-0.3.0-py311-linux-x86_64", "/state/agent-envs/0.3.0/bin/python")


def test_a_first_start_runs_the_base_install() -> None:
    state = LauncherState.from_dict(None)
    assert state.committed is None and state.trial is None and state.floor == ""


def test_a_trial_that_passes_is_committed_and_the_old_one_kept_as_previous() -> None:
    state = commit(begin_trial(LauncherState(), V2, "t1"))
    assert state.committed == V2 and state.previous is None and state.trial is None and state.floor == "0.2.0"
    state = commit(begin_trial(state, V3, "t2"))
    assert (state.committed, state.previous, state.floor) == (V3, V2, "0.3.0")
    assert [o["result"] for o in state.outcomes] == ["committed", "committed"] and state.seq == 2


def test_a_trial_that_fails_rolls_back_says_why_and_is_never_tried_again() -> None:
    base = commit(begin_trial(LauncherState(), V2, "t1"))
    state = roll_back(begin_trial(base, V3, "t2"), "the new agent exited with code 1")
    assert state.committed == V2 and state.trial is None and state.floor == "0.2.0"
    assert state.outcomes[-1]["result"] == "rolled-back" and "exited with code 1" in state.outcomes[-1]["reason"]
    assert request_problem(state, V3) == f"{V3.release_id} failed its health gate before"
    assert request_problem(state, V2) == f"{V2.release_id} is already committed"


def test_a_downgrade_commits_without_lowering_the_floor() -> None:
    state = commit(begin_trial(commit(begin_trial(LauncherState(), V3, "a")), V2, "b"))
    assert state.committed == V2 and state.floor == "0.3.0"


def test_an_interrupted_trial_is_tried_again_then_rolled_back() -> None:
    state = begin_trial(LauncherState(), V2, "t1")
    for attempt in range(2, MAX_ATTEMPTS + 1):
        state = resume_after_restart(state, f"t{attempt}")
        assert state.trial is not None and state.trial.attempt == attempt and state.trial.token == f"t{attempt}"
    state = resume_after_restart(state, "last")
    assert state.trial is None and state.committed is None and V2.release_id in state.failed
    assert "restarted during its trial" in state.outcomes[-1]["reason"]


def test_no_request_is_taken_while_a_trial_runs() -> None:
    assert request_problem(begin_trial(LauncherState(), V2, "t"), V3) == f"a trial of {V2.release_id} is running"


def test_the_state_reads_back_exactly_as_written(tmp_path: Path) -> None:
    state = roll_back(begin_trial(commit(begin_trial(LauncherState(), V2, "a")), V3, "b"), "no health report")
    state = begin_trial(state, Environment("0.4.0", "r4", "/p"), "c")
    write_json(tmp_path / "state.json", state.to_dict())
    assert LauncherState.from_dict(read_state(tmp_path)) == state


def test_the_launcher_loads_no_third_party_module() -> None:
    """Standard library only: no agent release (which brings its own pydantic, numpy, ...) can break it."""
    code = (
        "import sys, edgefleet.launcher.__main__; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'numpy', 'yaml', 'cryptography', 'paho', 'zstandard', 'psutil', 'onnxruntime')); "
        "print(bad); assert not bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_shipped_unit_runs_the_launcher_with_agent_arguments_the_cli_accepts() -> None:
    import shlex

    from edgefleet.cli.main import build_parser as cli_parser
    from edgefleet.launcher.__main__ import build_parser

    unit = (Path(__file__).parents[3] / "deploy" / "fleet" / "systemd" / "edgefleet-agent.service").read_text()
    lines = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    words = [w for w in shlex.split(lines) if w != "$EDGEFLEET_AGENT_ARGS"]
    assert words[0].endswith("/edgefleet-launcher")
    launcher = build_parser().parse_args(words[1:])
    assert launcher.state_dir == Path("/var/lib/edgefleet") and launcher.deadline == 300
    agent_args = [w.replace("${EDGEFLEET_BROKER}", "mqtts://b:8883").replace("${EDGEFLEET_DEVICE_ID}", "dev-1")
                  for w in launcher.agent_args[1:]]  # fmt: skip
    args = cli_parser().parse_args(["agent", "--state-dir", str(launcher.state_dir), *agent_args])
    assert (args.command, args.device_id, args.broker) == ("agent", "dev-1", "mqtts://b:8883")
