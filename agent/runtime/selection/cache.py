"""The provider decision cache (`selection.json`): decisions and providers that hung or crashed, keyed by bundle,
hardware, runtime versions, threads and policy, so that a restart loads only the winner and a runtime upgrade
measures again; and the crash journal that catches a load which took the whole process down."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import threading
import time
from glob import glob
from pathlib import Path
from typing import Any

import psutil

from edgefleet.agent.runtime import backends
from edgefleet.agent.runtime.selection.policy import Policy
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.durable import atomic_write

log = logging.getLogger(__name__)

CACHE_FILE = "selection.json"
CACHE_SCHEMA_VERSION = 1
_MAX_CACHED = 64


def hardware_fingerprint() -> dict[str, str]:
    """What the decision depends on besides software: CPU model, core count, accelerator device nodes."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    nodes = sorted(glob("/dev/dri/renderD*") + glob("/dev/accel/accel*") + glob("/dev/nvidia[0-9]*"))
    return {
        "arch": platform.machine(),
        "os": platform.system().lower(),
        "cpu": cpu,
        "cpus": str(os.cpu_count() or 1),
        "accelerators": ",".join(nodes),
    }


def decision_key(manifest: Manifest, threads: int, policy: Policy) -> tuple[str, dict[str, Any]]:
    """(a short hash, what it hashes): bundle, hardware, each provider's runtime versions, threads, policy.

    Computed without importing any optional runtime (versions come from package metadata), so that a
    restart with a cached decision loads only the winner's runtime. A new accelerator shows up in the
    hardware part (device nodes), a new or upgraded package in the versions.
    """
    parts: dict[str, Any] = {
        "bundle_id": manifest.bundle_id,
        "hardware": hardware_fingerprint(),
        "runtimes": backends.runtime_versions(manifest.providers),
        "threads": threads,
        "policy": policy.model_dump(include={"prefer", "exclude", "tie_margin"}),
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]
    return digest, parts


def model_identity(manifest: Manifest) -> str:
    """sha256 of the model artifact: its file's, or for a directory (an .mlpackage) a hash over its files'."""
    prefix = manifest.model_path.rstrip("/") + "/"
    for entry in manifest.files:
        if entry.path == manifest.model_path:
            return entry.sha256
    inside = sorted(f"{e.path}:{e.sha256}" for e in manifest.files if e.path.startswith(prefix))
    return hashlib.sha256("\n".join(inside).encode()).hexdigest() if inside else ""


class DecisionCache:
    """`selection.json` in the agent's cache folder: decisions and providers that hung or crashed, by key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / CACHE_FILE
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("provider decision cache %s is unreadable (%s); measuring again", self.path, err)
            return {}
        if not isinstance(data, dict) or data.get("schema_version") != CACHE_SCHEMA_VERSION:
            return {}
        entries = data.get("decisions")
        return entries if isinstance(entries, dict) else {}

    def _write(self, entries: dict[str, Any]) -> None:
        newest = sorted(entries.items(), key=lambda kv: kv[1].get("updated_at", 0), reverse=True)[:_MAX_CACHED]
        self.folder.mkdir(parents=True, exist_ok=True)
        body = {"schema_version": CACHE_SCHEMA_VERSION, "decisions": dict(newest)}
        atomic_write(self.path, json.dumps(body, indent=2, sort_keys=True).encode())

    def get(self, key: str) -> dict[str, Any]:
        with self._lock:
            entry = self._read().get(key)
            return entry if isinstance(entry, dict) else {}

    def update(self, key: str, **values: Any) -> None:
        with self._lock:
            entries = self._read()
            entry = _entry(entries, key)
            entry.update(values, updated_at=time.time())
            entries[key] = entry
            self._write(entries)

    def poison(self, key: str, provider: str, reason: str) -> None:
        with self._lock:
            entries = self._read()
            entry = _entry(entries, key)
            entry.setdefault("poisoned", {})[provider] = reason
            entry.pop("provider", None)  # a decision that includes a crashing provider is void
            entry["updated_at"] = time.time()
            entries[key] = entry
            self._write(entries)

    def forget_decision(self, key: str) -> None:
        with self._lock:
            entries = self._read()
            if isinstance(entries.get(key), dict):
                entries[key].pop("provider", None)
                self._write(entries)

    # --- the crash journal
    def journal(self, key: str, provider: str) -> Path:
        path = self.folder / f"selection-inflight-{key}-{hashlib.sha256(provider.encode()).hexdigest()[:8]}.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(
            path, json.dumps({"key": key, "provider": provider, "pid": os.getpid(), "at": time.time()}).encode()
        )
        return path

    def recover_journals(self) -> list[tuple[str, str]]:
        """Journals left by a process that died while loading: poison those providers. Returns (key, provider)."""
        found: list[tuple[str, str]] = []
        for path in self.folder.glob("selection-inflight-*.json"):
            try:
                record = json.loads(path.read_text())
                key, provider, pid, at = record["key"], record["provider"], int(record["pid"]), float(record["at"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if pid == os.getpid() or (psutil.pid_exists(pid) and _is_python(pid)):
                continue  # a load in flight in this (or another live) agent
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            self.poison(
                key,
                provider,
                f"crashed or hung the agent while loading (at {when}); not tried again until a runtime version changes",
            )
            path.unlink(missing_ok=True)
            found.append((key, provider))
        return found


def _entry(entries: dict[str, Any], key: str) -> dict[str, Any]:
    found = entries.get(key)
    return found if isinstance(found, dict) else {}


def _is_python(pid: int) -> bool:
    try:
        return "python" in psutil.Process(pid).name().lower()
    except psutil.Error:
        return False
