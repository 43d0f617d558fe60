"""The `edgefleet` command as a subprocess, and the check that an error is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def edgefleet(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if home is not None:
        import os

        env = {**os.environ, "EDGEFLEET_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "edgefleet", *args], capture_output=True, text=True, timeout=120, env=env
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgefleet: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
