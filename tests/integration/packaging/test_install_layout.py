"""The package layout, as a wheel and as an editable install: setup.py maps the top-level agent/, converter/ and
device_profiles/ under `edgefleet`, with no symlinks, and every module imports from where it was installed.

The wheel is built from a copy of what the Dockerfiles copy (tests/integration/packaging/test_demo_wheel.py checks
that list), installed with `--target` and imported in a fresh interpreter whose path holds only that folder; the
editable install is this test run's own. The Python 3.10 device install: scripts/test-installed-agent."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import edgefleet

from support.paths import REPO

SOURCES = ("pyproject.toml", "setup.py", "README.md", "edgefleet", "agent", "converter", "device_profiles")
MAPPED = {
    "edgefleet": REPO / "edgefleet",
    "edgefleet.agent": REPO / "agent",
    "edgefleet.converter": REPO / "converter",
    "edgefleet.device_profiles": REPO / "device_profiles",  # YAML data, a package so the editable finder maps it
}

WALK = """
import importlib, json, pkgutil, sys
import edgefleet, edgefleet.agent, edgefleet.converter
found = {}
for package in (edgefleet, edgefleet.agent, edgefleet.converter):
    found[package.__name__] = package.__file__
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__") or info.name in found:
            continue
        found[info.name] = importlib.import_module(info.name).__file__
print(json.dumps(found))
"""


def _checkout_modules() -> set[str]:
    """Every module the checkout holds, by its installed name (folders read, nothing imported)."""
    names = set()
    for name, folder in MAPPED.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and parts[-1] == "__main__":
                continue
            names.add(".".join([name, *parts]))
    return names


def test_the_wheel_holds_every_module_and_no_link_and_each_imports_from_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("edgefleet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        links = [i.filename for i in archive.infolist() if (i.external_attr >> 16) & 0o170000 == 0o120000]
        assert links == []
        assert "edgefleet/device_profiles/intel-x86-vnni.yaml" in archive.namelist()
        assert "edgefleet/control/dashboard/web/index.html" in archive.namelist()
        assert any(n.startswith("edgefleet/control/store/sql/migrations/sqlite/") for n in archive.namelist())
        archive.extractall(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    done = subprocess.run(
        [sys.executable, "-c", WALK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert set(found) == _checkout_modules()
    outside = {name: where for name, where in found.items() if not where.startswith(str(tmp_path / "site"))}
    assert outside == {}


def test_the_editable_install_maps_every_module_to_the_checkout() -> None:
    found = {}
    for name in MAPPED:
        package = importlib.import_module(name)
        found[name] = package.__file__
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            if not info.name.endswith("__main__") and info.name not in found:
                found[info.name] = importlib.import_module(info.name).__file__
    assert set(found) == _checkout_modules()
    for name, where in found.items():
        folder = next(f for n, f in sorted(MAPPED.items(), key=lambda kv: -len(kv[0])) if name.startswith(n))
        assert Path(where).is_relative_to(folder), (name, where)
    assert Path(edgefleet.__file__).parent == REPO / "edgefleet"
