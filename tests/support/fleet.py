"""Test helpers: an agent running as a real subprocess, and a recorder of what devices publish."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

from edgefleet.control.credentials.keyring import KEYSET_NAME, HostKeys
from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.messages import DeviceStatus, Event, SlotClass, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair

from support.publishing.desired import deploy_slot
from support.servers.brokers import free_port
from support.slots import slot_of

T = TypeVar("T")


def silero_model() -> Path:
    """silero-vad's ONNX file, found without importing the package (its __init__ imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("silero-vad is not installed: pip install --no-deps silero-vad")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


# The agent's interpreter. scripts/test also runs the agent tests with EDGEFLEET_AGENT_PYTHON naming a separate
# Python 3.10 environment that holds only the pip-installed base package (the device install), never this checkout.
AGENT_PYTHON = os.environ.get("EDGEFLEET_AGENT_PYTHON", "")


class AgentProcess:
    def __init__(
        self,
        device_id: str,
        state_dir: Path,
        *,
        broker: str,
        trust: Path,
        profile: str | None = "intel-x86-vnni",
        groups: tuple[str, ...] = (),
        telemetry_interval: float = 1.0,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        python: tuple[str, ...] = (),
    ) -> None:
        """`profile` None: no --profile, the agent detects its own. `python`: the command that runs the agent's Python
        (default EDGEFLEET_AGENT_PYTHON, else this interpreter), e.g. one inside the ARM64 root (support/arm64.py)."""
        self.device_id, self.state_dir, self.extra_env = device_id, state_dir, env or {}
        self.cmd = [
            *(python or (AGENT_PYTHON or sys.executable,)), "-m", "edgefleet", "agent", "--broker", broker,
            "--device-id", device_id, "--state-dir", str(state_dir), *(("--profile", profile) if profile else ()),
            "--trust", str(trust), "--telemetry-interval", str(telemetry_interval), "--threads", "1",
            *(extra if "--http-port" in extra else ("--http-port", "0", *extra)),
        ]  # fmt: skip
        for group in groups:
            self.cmd += ["--group", group]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{device_id}.log"

    def start(self) -> AgentProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        if AGENT_PYTHON:  # the installed package alone: nothing from the checkout on the path
            env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.state_dir if AGENT_PYTHON else None
        )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class FleetWatcher:
    """Records every status, event and telemetry message the devices publish."""

    def __init__(self, conn: Connection, topics: Topics) -> None:
        self.topics = topics
        self._lock = threading.Lock()
        self.status: dict[str, DeviceStatus] = {}
        self.events: list[Event] = []
        self.telemetry: list[Telemetry] = []
        conn.subscribe(topics.all_status(), self._on_status)
        conn.subscribe(topics.all_events(), self._on_event)
        conn.subscribe(topics.all_telemetry(), self._on_telemetry)

    def _on_status(self, topic: str, payload: bytes, retained: bool) -> None:
        if payload:
            message = decode(DeviceStatus, payload)
            with self._lock:
                self.status[message.device_id] = message

    def _on_event(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._lock:
            self.events.append(decode(Event, payload))

    def _on_telemetry(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._lock:
            self.telemetry.append(decode(Telemetry, payload))

    def wait_for(self, what: str, predicate: Callable[[], T | None], timeout: float = 30.0) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                result = predicate()
            if result:
                return result
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; events: {self.event_log()}")

    def event_log(self) -> list[str]:
        return [f"{e.device_id} {e.kind} {e.bundle_id}: {e.detail}" for e in self.events]

    def serving(self, device_id: str, bundle_id: str, timeout: float = 30.0, slot: str = "default") -> DeviceStatus:
        def check() -> DeviceStatus | None:
            status = self.status.get(device_id)
            entry = slot_of(status, slot)
            ok = status and status.online and entry.active_bundle == bundle_id and entry.verified
            return status if ok else None

        return self.wait_for(f"{device_id} serving {bundle_id} in slot {slot}", check, timeout)

    def event(self, device_id: str, kind: str, timeout: float = 30.0, bundle_id: str | None = None) -> Event:
        def check() -> Event | None:
            for event in self.events:
                if event.device_id == device_id and event.kind == kind and bundle_id in (None, event.bundle_id):
                    return event
            return None

        return self.wait_for(f"{device_id} event {kind}", check, timeout)


def derive_bundle(source: Path, out_dir: Path, key: SigningKey, trusted: TrustedKeys, **changes: object) -> Path:
    """A copy of `source` with manifest fields changed (e.g. model_version, profile), re-signed by `key`.

    Stands in for a second conversion run: the files stay the same, the manifest says what the test needs
    (`bundle_id` names the result; by default the source's id with the changed values appended).
    """
    unpacked = out_dir / f"unpacked-{len(list(out_dir.glob('unpacked-*')))}"
    manifest = unpack_bundle(source, unpacked, trusted)
    suffix = "-".join(f"{v}" for k, v in changes.items() if k != "bundle_id")
    bundle_id = changes.pop("bundle_id", None) or f"{manifest.bundle_id}-{suffix}"
    updated = manifest.model_copy(update={**changes, "bundle_id": bundle_id})
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    path = out_dir / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def deploy_to(
    conn: Connection,
    topics: Topics,
    bundle: Path,
    *,
    devices: tuple[str, ...] = (),
    groups: tuple[str, ...] = (),
    rollback: bool = False,
    block_size: int = 16 * 1024,
    layout: Literal["chunks", "blocks"] = "chunks",
    slot: str = "default",
    slot_class: SlotClass | None = None,
) -> str:
    manifest, _ = publish_bundle(conn, topics, bundle, block_size=block_size, layout=layout)
    if slot_class is not None:
        deploy_slot(
            conn, topics, manifest, slot=slot, devices=devices, groups=groups, rollback=rollback, slot_class=slot_class
        )
    elif slot == "default":
        deploy(conn, topics, manifest, devices=list(devices), groups=list(groups), rollback=rollback)
    else:
        deploy_slot(conn, topics, manifest, slot=slot, devices=devices, groups=groups, rollback=rollback)
    return manifest.bundle_id


def padded_bundle(
    source: Path, out_dir: Path, key: SigningKey, trusted: TrustedKeys, *, version: str, pad_bytes: int, seed: int = 0
) -> Path:
    """A re-signed copy of `source` carrying an extra pinned file of random bytes: a bundle big enough
    that a transfer takes long enough to be interrupted at random points."""
    import numpy as np

    unpacked = out_dir / f"padded-src-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    padding = unpacked / "extra" / "padding.bin"
    padding.parent.mkdir(parents=True, exist_ok=True)
    padding.write_bytes(np.random.default_rng(seed).bytes(pad_bytes))
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    sources["extra/padding.bin"] = padding
    updated = manifest.model_copy(
        update={
            "model_version": version,
            "bundle_id": f"{manifest.bundle_id}-v{version}",
            "files": describe_files(sources),
        }
    )
    path = out_dir / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def bundle_with(
    source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str, extra: dict[str, bytes]
) -> Path:
    """A re-signed copy of `source` carrying `extra` files (so each test's chunks are its own)."""
    unpacked = out / f"src-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    for rel, data in extra.items():
        (unpacked / rel).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / rel).write_bytes(data)
        sources[rel] = unpacked / rel
    updated = manifest.model_copy(
        update={
            "model_version": version,
            "bundle_id": f"{manifest.bundle_id}-c{version}",
            "files": describe_files(sources),
        }
    )
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def attacker_keys(directory: Path, real: HostKeys) -> HostKeys:
    """What an attacker with broker rights but no signing key can hold: keys of their own for both roles and a
    copy of the real (public) key set, which does not delegate their keys."""
    directory.mkdir(parents=True, exist_ok=True)
    for role in ("bundle", "ops"):
        generate_keypair(directory, role)
    (directory / KEYSET_NAME).write_bytes((real.directory / KEYSET_NAME).read_bytes())
    return HostKeys(directory)


class ServedModel:
    """A model converted for generic-x86-64 and served by one real agent process with its local HTTP API."""

    def __init__(self, port: int, bundle_id: str, host: Connection, watcher: FleetWatcher) -> None:
        self.port, self.bundle_id, self.host, self.watcher = port, bundle_id, host, watcher


@contextlib.contextmanager
def serve_model(
    broker_url: str, root_pub: Path, key: SigningKey, model: Path, root: Path, *, name: str, device: str,
    extra: tuple[str, ...] = (),
) -> Iterator[ServedModel]:  # fmt: skip
    """Convert `model` with `root/calib.npz` and `root/eval.npz`, deploy it to a fresh agent, wait until it serves."""
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("generic-x86-64")], calib=root / "calib.npz", eval=root / "eval.npz",
            out=root / "out", key=key, name=name, version="1", report=False,
        )
    )  # fmt: skip
    assert result.bundle, result.error
    host = Connection(broker_url, f"{device}-host-{root.name}", protocol="auto").start()
    watcher = FleetWatcher(host, Topics())
    port = free_port()
    process = AgentProcess(device, root / device, broker=broker_url, trust=root_pub, profile="generic-x86-64",
                           extra=("--http-port", str(port), *extra)).start()  # fmt: skip
    try:
        bundle_id = deploy_to(host, Topics(), Path(result.bundle), devices=(device,))
        watcher.serving(device, bundle_id, timeout=90)
        yield ServedModel(port, bundle_id, host, watcher)
    finally:
        process.stop()
        host.stop()
