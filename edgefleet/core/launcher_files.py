"""The files the agent and its launcher (edgefleet/launcher/) share under the agent's state directory.

Standard library only: the launcher imports this module and nothing else of edgefleet, so no agent release can
break it. Every file is written whole (write-temp, fsync, rename, fsync the directory: core/durable.py), so a power
cut leaves the old content or the new, never a torn file.

    STATE_DIR/launcher/state.json     the launcher's state; written by the launcher only, read by the agent
    STATE_DIR/launcher/request.json   the agent's hand-over: a release staged in its own environment, to try
    STATE_DIR/launcher/health/T.json  the new agent's report that it passed its health gate (T: the trial's token)
    STATE_DIR/agent-envs/VERSION/     one virtual environment per agent release (built by the agent, offline)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgefleet.core.durable import atomic_write

LAUNCHER_DIR = "launcher"
ENVS_DIR = "agent-envs"
STATE_NAME = "state.json"
REQUEST_NAME = "request.json"
HEALTH_DIR = "health"
COMPLETE_NAME = ".complete"  # written last into an environment the agent built: the launcher starts no other
ENV_LAUNCHER = "EDGEFLEET_LAUNCHER"  # set by the launcher for its agent: the launcher's directory
ENV_TRIAL = "EDGEFLEET_LAUNCHER_TRIAL"  # set for an agent on trial: the token its health report must carry


def launcher_dir(state_dir: Path) -> Path:
    return state_dir / LAUNCHER_DIR


def envs_dir(state_dir: Path) -> Path:
    return state_dir / ENVS_DIR


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file is missing or unreadable (never torn: files are written whole)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())


def read_state(directory: Path) -> dict[str, Any] | None:
    return read_json(directory / STATE_NAME)


def write_request(directory: Path, *, release_id: str, version: str, python: str) -> None:
    """The agent's hand-over: try `python` (an environment under agent-envs) as the agent, `version`."""
    write_json(directory / REQUEST_NAME, {"release_id": release_id, "version": version, "python": python})


def read_request(directory: Path) -> dict[str, Any] | None:
    return read_json(directory / REQUEST_NAME)


def health_path(directory: Path, token: str) -> Path:
    return directory / HEALTH_DIR / f"{token}.json"


def write_health(directory: Path, token: str, detail: dict[str, Any]) -> None:
    write_json(health_path(directory, token), {**detail, "token": token, "pid": os.getpid()})


__all__ = [
    "COMPLETE_NAME",
    "ENVS_DIR",
    "ENV_LAUNCHER",
    "ENV_TRIAL",
    "HEALTH_DIR",
    "LAUNCHER_DIR",
    "REQUEST_NAME",
    "STATE_NAME",
    "envs_dir",
    "health_path",
    "launcher_dir",
    "read_json",
    "read_request",
    "read_state",
    "write_health",
    "write_json",
    "write_request",
]
