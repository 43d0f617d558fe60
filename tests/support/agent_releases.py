"""Agent releases for tests: the edgefleet wheel built once from this tree, other versions derived from it, the
dependency wheels cached across sessions, and a launcher process (edgefleet/launcher/) running real agents.

Deriving a version rewrites the wheel as a build of the same tree with another version number would: the
dist-info folder, METADATA's Version, `edgefleet.__version__` and RECORD's hashes. A broken release is the same
with its `python -m edgefleet` entry made to exit at once (what a release that cannot start looks like).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.core.release import build_release

from support.paths import REPO

# The agent's runtime dependencies, at the versions this environment runs (pip resolves what they need).
RUNTIME = ("numpy", "paho-mqtt", "psutil", "pydantic", "PyYAML", "cryptography", "zstandard", "onnxruntime")
CACHE = Path(os.environ.get("EDGEFLEET_RELEASE_WHEELS", Path.home() / ".cache" / "edgefleet-tests" / "release-wheels"))
BROKEN_MAIN = 'raise SystemExit("edgefleet {version}: this release is broken on purpose (it cannot start)")\n'


def dependency_wheels() -> Path:
    """The dependency wheels, downloaded once (pip's ordinary client) and kept in CACHE."""
    pins = [f"{name}=={version(name)}" for name in RUNTIME]
    folder = CACHE / hashlib.sha256(" ".join(pins).encode()).hexdigest()[:12]
    if (folder / ".complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
         "--dest", str(folder), *pins],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"the dependency wheels could not be downloaded (offline?): {done.stderr.strip()[-300:]}")
    (folder / ".complete").write_text("\n".join(pins))
    return folder


def build_agent_wheel(out: Path) -> Path:
    """This tree's edgefleet wheel (no dependencies)."""
    out.mkdir(parents=True, exist_ok=True)
    build = out / "build-tree"
    shutil.rmtree(build, ignore_errors=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()  # fmt: skip
    for rel in listed:
        if rel.startswith(("tests/", "bench/", "docs/")) or not (REPO / rel).is_file():
            continue
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, build / rel)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--wheel-dir", str(out), str(build)],
        check=True, capture_output=True,
    )  # fmt: skip
    shutil.rmtree(build, ignore_errors=True)
    (wheel,) = out.glob("edgefleet-*.whl")
    return wheel


def derive_wheel(wheel: Path, new_version: str, out_dir: Path, *, broken: bool = False) -> Path:
    """`wheel` as version `new_version` (a build of the same tree with another version number)."""
    old_version = wheel.name.split("-")[1]
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name.replace(f"-{old_version}-", f"-{new_version}-")
    old_info, new_info = f"edgefleet-{old_version}.dist-info/", f"edgefleet-{new_version}.dist-info/"
    records: list[str] = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dest:
        for item in source.infolist():
            name = item.filename.replace(old_info, new_info)
            if name == f"{new_info}RECORD":
                continue
            data = source.read(item)
            if name == "edgefleet/__init__.py":
                old, new = f'__version__ = "{old_version}"', f'__version__ = "{new_version}"'
                data = data.replace(old.encode(), new.encode())
            elif name == f"{new_info}METADATA":
                data = data.replace(f"\nVersion: {old_version}\n".encode(), f"\nVersion: {new_version}\n".encode())
            elif name == "edgefleet/__main__.py" and broken:
                data = BROKEN_MAIN.format(version=new_version).encode()
            dest.writestr(zipfile.ZipInfo(name, date_time=item.date_time), data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        records.append(f"{new_info}RECORD,,")
        dest.writestr(f"{new_info}RECORD", "\n".join(records) + "\n")
    return target


def release_file(
    agent_wheel: Path, deps: Path, version_: str, out: Path, keys: HostKeys, *, broken: bool = False
) -> Path:
    """A signed release: edgefleet `version_` (derived from `agent_wheel`) and the dependency wheels."""
    wheels = out / f"wheels-{version_}"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    for dep in deps.glob("*.whl"):
        shutil.copy2(dep, wheels / dep.name)
    derive_wheel(agent_wheel, version_, wheels, broken=broken)
    path = out / f"agent-{version_}.release"
    build_release(wheels, version_, keys.release_key(), path)
    return path


class LauncherProcess:
    """`python -m edgefleet.launcher` for one device, as the shipped systemd unit runs it (its base install: this
    interpreter; the agents it starts log into the launcher's log)."""

    def __init__(self, state_dir: Path, agent_args: list[str], *, deadline_s: float = 150.0) -> None:
        self.state_dir, self.agent_args = state_dir, agent_args
        self.cmd = [sys.executable, "-m", "edgefleet.launcher", "--state-dir", str(state_dir), "--deadline",
                    str(deadline_s), "--stop-timeout", "20", "--", *agent_args]  # fmt: skip
        self.log_path = state_dir.parent / f"{state_dir.name}-launcher.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LauncherProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.state_dir)
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
