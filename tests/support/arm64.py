"""The ARM64 device under test: scripts/arm64-root's Debian arm64 root, run under QEMU user emulation, with the
project's wheel installed in it as a device installs it."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

SCRIPT = REPO / "scripts" / "arm64-root"
PYTHON = "/opt/edgefleet/venv/bin/python"  # the root's virtual environment (scripts/arm64-root)
BUILD_TIMEOUT_S = 1500.0  # cold: a Debian root and every aarch64 wheel (249 s here at a load of 12); cached after


@dataclass(frozen=True)
class Arm64Root:
    path: Path
    build_log: str

    def python(self, *binds: Path, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """The command that runs the root's Python, with `binds` (host directories) at the same paths inside and
        `env` set (QEMU_CPU picks the emulated CPU: QEMU reads it, as it reads the rest of its environment)."""
        bound = [arg for directory in binds for arg in ("--bind", str(directory))]
        settings = [arg for name, value in (env or {}).items() for arg in ("--env", f"{name}={value}")]
        return (str(SCRIPT), "exec", *bound, *settings, "--", PYTHON)

    def run(
        self, args: Sequence[str], *binds: Path, env: Mapping[str, str] | None = None, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """The root's Python with `args`; fails with its output when it exits non-zero."""
        done = subprocess.run(
            [*self.python(*binds, env=env), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} in the arm64 root exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done


def build_root() -> Arm64Root:
    """Build the root, or reuse the cached one, and install the checkout's wheel in it (scripts/arm64-root)."""
    done = subprocess.run(
        [str(SCRIPT), "build"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False, cwd=REPO
    )
    if done.returncode != 0:
        raise AssertionError(f"scripts/arm64-root failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Arm64Root(Path(done.stdout.strip().splitlines()[-1]), done.stderr)
