"""The launcher's state machine: which agent environment is committed, which one is on trial, what happened.

Every transition is a pure function from one state to the next; the caller writes the result whole
(core/launcher_files.py) before it acts on it, so a power cut or a `kill -9` at any step leaves a state the next start
resumes from:
- committed (or the base install, `committed is None`) runs; a hand-over request starts a trial;
- a trial runs the new environment; its health report commits it, its exit or the deadline rolls it back;
- a start that finds a trial in the state (the launcher died during it) tries it again, at most `MAX_ATTEMPTS`
  times in all, then rolls it back: a release that takes the device down with it cannot hold it in a loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

MAX_ATTEMPTS = 2  # trials of one release the launcher starts (a restart during one counts) before rolling it back
KEEP_OUTCOMES = 20


@dataclass(frozen=True)
class Environment:
    """One agent release's environment: its interpreter runs `python -m edgefleet agent`."""

    version: str
    release_id: str
    python: str

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "release_id": self.release_id, "python": self.python}

    @classmethod
    def from_dict(cls, data: Any) -> Environment | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(str(data["version"]), str(data["release_id"]), str(data["python"]))
        except KeyError:
            return None


@dataclass(frozen=True)
class Trial:
    env: Environment
    token: str
    attempt: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {**self.env.to_dict(), "token": self.token, "attempt": self.attempt}


@dataclass(frozen=True)
class LauncherState:
    committed: Environment | None = None  # None: the base install the launcher came with
    previous: Environment | None = None
    trial: Trial | None = None
    floor: str = ""  # the highest agent version ever committed here
    failed: tuple[str, ...] = ()  # releases rolled back: never tried again (a new release id is a new decision)
    outcomes: tuple[dict[str, Any], ...] = field(default=())
    seq: int = 0  # outcomes numbered, so the agent reports each once

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "committed": self.committed.to_dict() if self.committed else None,
            "previous": self.previous.to_dict() if self.previous else None,
            "trial": self.trial.to_dict() if self.trial else None,
            "floor": self.floor,
            "failed": list(self.failed),
            "outcomes": list(self.outcomes),
            "seq": self.seq,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LauncherState:
        """The state as written; a missing or unreadable file is the first start (the base install runs)."""
        if not data:
            return cls()
        trial_data = data.get("trial")
        trial_env = Environment.from_dict(trial_data)
        trial = None
        if trial_env is not None and isinstance(trial_data, dict):
            trial = Trial(trial_env, str(trial_data.get("token", "")), int(trial_data.get("attempt", 1)))
        return cls(
            committed=Environment.from_dict(data.get("committed")),
            previous=Environment.from_dict(data.get("previous")),
            trial=trial,
            floor=str(data.get("floor", "")),
            failed=tuple(str(r) for r in data.get("failed", [])),
            outcomes=tuple(o for o in data.get("outcomes", []) if isinstance(o, dict)),
            seq=int(data.get("seq", 0)),
        )


def _outcome(state: LauncherState, env: Environment, result: str, reason: str) -> LauncherState:
    seq = state.seq + 1
    entry = {"seq": seq, "release_id": env.release_id, "version": env.version, "result": result, "reason": reason,
             "at": round(time.time(), 3)}  # fmt: skip
    return replace(state, seq=seq, outcomes=(*state.outcomes, entry)[-KEEP_OUTCOMES:])


def request_problem(state: LauncherState, env: Environment) -> str | None:
    """Why a hand-over request is not tried, or None."""
    if state.trial is not None:
        return f"a trial of {state.trial.env.release_id} is running"
    if env.release_id in state.failed:
        return f"{env.release_id} failed its health gate before"
    if state.committed is not None and state.committed.release_id == env.release_id:
        return f"{env.release_id} is already committed"
    return None


def begin_trial(state: LauncherState, env: Environment, token: str) -> LauncherState:
    return replace(state, trial=Trial(env, token, 1))


def resume_after_restart(state: LauncherState, token: str) -> LauncherState:
    """At start-up: a trial left in the state was interrupted (the launcher or the device went down). Try it again
    with a new token, or, after MAX_ATTEMPTS, roll it back."""
    if state.trial is None:
        return state
    if state.trial.attempt >= MAX_ATTEMPTS:
        reason = f"the launcher restarted during its trial {state.trial.attempt} times"
        return roll_back(state, reason)
    return replace(state, trial=Trial(state.trial.env, token, state.trial.attempt + 1))


def commit(state: LauncherState) -> LauncherState:
    """The trial passed its health gate: it becomes the committed environment, the old one the previous."""
    assert state.trial is not None
    env = state.trial.env
    floor = env.version if _newer(env.version, state.floor) else state.floor
    reason = f"passed its health gate (attempt {state.trial.attempt})"
    done = replace(state, committed=env, previous=state.committed, trial=None, floor=floor)
    return _outcome(done, env, "committed", reason)


def roll_back(state: LauncherState, reason: str) -> LauncherState:
    """The trial failed: the committed environment runs again, and the release is never tried again."""
    assert state.trial is not None
    env = state.trial.env
    failed = tuple(dict.fromkeys((*state.failed, env.release_id)))
    return _outcome(replace(state, trial=None, failed=failed), env, "rolled-back", reason)


def _newer(version: str, than: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in v.split("."))
        except ValueError:
            return ()

    return not than or key(version) > key(than)


__all__ = [
    "MAX_ATTEMPTS",
    "Environment",
    "LauncherState",
    "Trial",
    "begin_trial",
    "commit",
    "request_problem",
    "resume_after_restart",
    "roll_back",
]
