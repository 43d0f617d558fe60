"""The `edgefleet` command as a subprocess, and the check that an error is one line."""

from __future__ import annotations

import re
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


PROGRESS = re.compile(r"\[ *\d+ s\] ")  # a progress line of `edgefleet convert` where stderr is no terminal


def said(stderr: str) -> list[str]:
    """What a command said on stderr, less its progress lines: the non-empty lines a user reads as its answer."""
    return [line for line in stderr.splitlines() if line.strip() and not PROGRESS.match(line)]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = said(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgefleet: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
