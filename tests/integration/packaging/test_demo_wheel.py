"""The main job from an installed package: build the wheel, install it with the host extra into a fresh virtual
environment outside the checkout, and run `edgefleet demo --json` in an empty directory.

The demo model and its data are package data (`edgefleet/demo_assets/`); this proves the wheel carries them and that
nothing reaches back into the clone. pip resolves from whatever index this machine is configured for, as a user's
would. Slow: the install alone takes about a minute here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.paths import REPO

# What the wheel is built from, so what the Dockerfiles copy (setup.py maps agent/, converter/ and device_profiles/
# under edgefleet/).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "edgefleet", "agent", "converter", "device_profiles")


def _clean_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing into a checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result


def test_every_dockerfile_copies_what_the_wheel_is_built_from() -> None:
    for dockerfile in sorted((REPO / "deploy" / "docker").glob("Dockerfile.*")):
        copied = set()
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
                copied.update(w.rstrip("/").replace("README.m[d]", "README.md") for w in words[1:-1])
        assert copied >= set(SOURCES), f"{dockerfile.name} does not copy {sorted(set(SOURCES) - copied)}"


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_demo_runs_from_a_wheel_installed_outside_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "wheels"), str(source)],
         tmp_path, 600)  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("edgefleet-*.whl")
    shutil.rmtree(source)  # nothing of the sources is left to fall back on

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120)
    python, edgefleet = venv / "bin" / "python", venv / "bin" / "edgefleet"
    started = time.monotonic()
    _run([str(python), "-m", "pip", "install", "--quiet", f"{wheel}[host]"], tmp_path, 1200)
    print(f"\npip install '{wheel.name}[host]' into a fresh venv: {time.monotonic() - started:.1f} s")

    empty = tmp_path / "empty"
    empty.mkdir()
    where = _run([str(python), "-c", "import edgefleet; print(edgefleet.__file__)"], empty, 60).stdout.strip()
    assert Path(where).is_relative_to(venv), f"edgefleet imported from {where}, not from the fresh venv"

    started = time.monotonic()
    result = _run([str(edgefleet), "demo", "--json", "--workdir", str(tmp_path / "work")], empty, 900)
    print(f"edgefleet demo --json from the wheel: {time.monotonic() - started:.1f} s")
    report = json.loads(result.stdout)
    assert [d["device_id"] for d in report["devices"]] == ["demo-1", "demo-2", "demo-3"]
    for device in report["devices"]:
        assert device["verified"] is True and device["state"] == "serving", device
        assert device["accuracy"] >= 0.95 and device["requests"] >= 360, device
    assert list(empty.iterdir()) == [], "the demo wrote into the directory it ran in"
