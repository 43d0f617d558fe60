"""Building a release's environment beside the running one, offline: a new venv, pip from the release's wheels only.

The environment is built at `agent-envs/VERSION` and marked complete (`.complete`, written whole) only once pip
finished and the new interpreter imported the release's own edgefleet at its version; an environment without the
mark (a power cut while building) is removed and built again, and the launcher never starts one.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from edgefleet.core.launcher_files import COMPLETE_NAME as COMPLETE
from edgefleet.core.launcher_files import read_json, write_json
from edgefleet.core.release import WHEELS_DIR, ReleaseError, ReleaseManifest

log = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 900.0


def environment_python(env: Path) -> Path:
    return env / "bin" / "python"


def complete(env: Path, manifest: ReleaseManifest) -> bool:
    mark = read_json(env / COMPLETE)
    return bool(mark and mark.get("release_id") == manifest.release_id and environment_python(env).exists())


def build_environment(
    release_dir: Path, manifest: ReleaseManifest, envs: Path, *, python: str = sys.executable,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> Path:  # fmt: skip
    """The interpreter of the release's environment (built now unless complete); ReleaseError when pip or the
    import check fails (the output's last line says why)."""
    env = envs / manifest.version
    if complete(env, manifest):
        return environment_python(env)
    shutil.rmtree(env, ignore_errors=True)
    envs.mkdir(parents=True, exist_ok=True)
    new_python = environment_python(env)
    steps = [
        [python, "-m", "venv", str(env)],
        [str(new_python), "-m", "pip", "install", "--no-index", "--find-links", str(release_dir / WHEELS_DIR),
         "--disable-pip-version-check", "--no-cache-dir", "--quiet", manifest.install_spec],
        [str(new_python), "-c", "import edgefleet, edgefleet.agent.daemon; print(edgefleet.__version__)"],
    ]  # fmt: skip
    output = ""
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=envs)
        except (OSError, subprocess.TimeoutExpired) as err:
            shutil.rmtree(env, ignore_errors=True)
            raise ReleaseError(f"building the environment of {manifest.release_id} failed: {err}") from err
        output = done.stdout.strip()
        if done.returncode != 0:
            shutil.rmtree(env, ignore_errors=True)
            last = (done.stderr.strip() or output).splitlines()[-1:] or ["no output"]
            raise ReleaseError(f"building the environment of {manifest.release_id} failed: {last[0][:300]}")
    if output != manifest.version:
        shutil.rmtree(env, ignore_errors=True)
        raise ReleaseError(
            f"the environment of {manifest.release_id} imports edgefleet {output}, not {manifest.version}"
        )
    write_json(env / COMPLETE, {"release_id": manifest.release_id, "version": manifest.version})
    log.info("built the environment of %s at %s", manifest.release_id, env)
    return new_python


__all__ = ["COMPLETE", "build_environment", "complete", "environment_python"]
