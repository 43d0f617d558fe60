"""`edgefleet demo`: the whole path on one machine — convert, publish, deploy to 3 agent processes,
send the evaluation set through each, and report the fleet."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet import demo_assets
from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.credentials.keyring import init as init_keys
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.fleet.status import DeviceRow, FleetView
from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.errors import EdgefleetError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.tensors import Dataset, load_dataset
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey
from edgefleet.demo_assets import CALIB, EVAL, MODEL

# (device id, profile, group): two VNNI machines share a group, the generic one is addressed directly.
DEVICES = [
    ("demo-1", "intel-x86-vnni", "vnni"),
    ("demo-2", "intel-x86-vnni", "vnni"),
    ("demo-3", "generic-x86-64", None),
]

Step = Callable[[str], None]


@dataclass(frozen=True)
class DemoDevice:
    device_id: str
    profile: str
    bundle: str
    provider: str | None
    provider_summary: str | None
    providers_not_chosen: dict[str, str]
    verified: bool
    p50_ms: float | None
    p95_ms: float | None
    requests: int
    accuracy: float
    state: str


@dataclass(frozen=True)
class DemoResult:
    broker: str
    workdir: str
    devices: list[DemoDevice]
    conversion: list[dict[str, Any]]
    seconds: float


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from edgefleet.control.broker.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.url


@contextlib.contextmanager
def _agents(url: str, workdir: Path, public_key: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    try:
        for device_id, profile, group in DEVICES:
            state = workdir / "devices" / device_id
            state.mkdir(parents=True, exist_ok=True)
            cmd = [
                sys.executable,
                "-m",
                "edgefleet",
                "agent",
                "--broker",
                url,
                "--device-id",
                device_id,
                "--state-dir",
                str(state),
                "--profile",
                profile,
                "--trust",
                str(public_key),
                "--telemetry-interval",
                "1",
                "--threads",
                "1",
                "--http-port",
                "0",
            ]
            if group:
                cmd += ["--group", group]
            log = (state / "agent.log").open("wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_demo(broker_url: str | None, workdir: Path | None, step: Step) -> DemoResult:
    from edgefleet.converter import ConvertRequest, convert, load_model

    started = time.monotonic()
    work = workdir or Path(tempfile.mkdtemp(prefix="edgefleet-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    keys = work / "keys"
    init_keys(keys)  # root (pinned by the agents), bundle and ops keys, and the key set delegating them
    model, calib, evaluation = demo_assets.asset(MODEL), demo_assets.asset(CALIB), demo_assets.asset(EVAL)
    profiles = sorted({p for _, p, _ in DEVICES})
    step(f"converting {model.name} for {', '.join(profiles)}")
    results = convert(
        ConvertRequest(
            model=model,
            profiles=[get_profile(p) for p in profiles],
            calib=calib,
            eval=evaluation,
            out=work / "bundles",
            key=SigningKey.load(keys / "bundle.key"),
            name="digits-cnn",
            version="1",
        ),
        progress=step,
    )
    bundles = {r.profile: Path(r.bundle) for r in results if r.bundle}
    missing = [r.profile for r in results if not r.bundle]
    if missing:
        raise EdgefleetError(f"conversion failed for {missing}")
    with _broker(broker_url) as url:
        step(f"starting 3 agents against {url}")
        with _agents(url, work, keys / "root.pub") as procs:
            conn = Connection(url, f"edgefleet-demo-{os.getpid()}").start(wait=10)
            topics = Topics()
            try:
                view = FleetView(conn, topics)
                desired: dict[str, str] = {}
                for profile, bundle in bundles.items():
                    step(f"publishing {bundle.name}")
                    manifest, _ = publish_bundle(conn, topics, bundle, keys=HostKeys(keys))
                    groups = sorted({g for _, p, g in DEVICES if p == profile and g})
                    devices = [d for d, p, g in DEVICES if p == profile and not g]
                    deploy(conn, topics, manifest, devices=devices, groups=groups, keys=HostKeys(keys))
                    desired.update({d: manifest.bundle_id for d, p, _ in DEVICES if p == profile})
                step("waiting for every device to verify, install and commit")
                _wait_committed(view, desired, procs, timeout=90)
                step("sending the evaluation set through each agent")
                data = load_dataset(evaluation, load_model(model).inputs, "evaluation")
                accuracy = _evaluate(conn, topics, [d for d, _, _ in DEVICES], data)
                view.wait_for_telemetry(5)
                time.sleep(1.5)  # one more telemetry tick so the latest report covers the eval traffic
                rows = {r.device_id: r for r in view.rows()}
            finally:
                conn.stop()
    report = [_device(rows[d], accuracy[d]) for d, _, _ in DEVICES]
    conversion: list[dict[str, Any]] = [
        {
            "profile": r.profile,
            "recipe": r.recipe,
            "accuracy": r.accuracy,
            "latency_ms": r.latency_ms,
            "rejected": [c for c in r.candidates if c.get("rejected")],
        }
        for r in results
    ]
    return DemoResult(url, str(work), report, conversion, round(time.monotonic() - started, 1))


def _wait_committed(
    view: FleetView, desired: dict[str, str], procs: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [DEVICES[i][0] for i, p in enumerate(procs) if p.poll() is not None]
        if dead:
            raise EdgefleetError(f"agent process(es) exited: {', '.join(dead)}; see their agent.log")
        statuses = view.statuses()
        if all((s := statuses.get(d)) and _runs(s, b) for d, b in desired.items()):
            return
        time.sleep(0.2)
    state = {
        d: (s.state, [(slot.slot, slot.active_bundle, slot.last_error) for slot in s.slots], s.last_error)
        for d, s in view.statuses().items()
    }
    raise EdgefleetError(f"devices did not commit within {timeout:g} s: {state}")


def _runs(status: DeviceStatus, bundle_id: str) -> bool:
    """Whether a slot of the device runs the bundle, verified."""
    return any(slot.active_bundle == bundle_id and slot.verified for slot in status.slots)


def _evaluate(conn: Connection, topics: Topics, devices: list[str], data: Dataset) -> dict[str, float]:
    """Top-1 of each device's answers on the evaluation set, all devices in parallel."""
    labels = data.labels
    if labels is None:
        raise EdgefleetError("the demo's evaluation set has no labels")

    def one(device: str) -> float:
        remote = RemoteModel(conn, topics, device)
        try:
            answers = remote.infer_many(data.samples())
        finally:
            remote.close()
        failed = [a.error for a in answers if not a.ok]
        if failed:
            raise EdgefleetError(f"{device} refused {len(failed)} requests, first: {failed[0]}")
        predicted = np.array([next(iter(a.outputs.values())).to_array().argmax() for a in answers])
        return float(np.mean(predicted == labels))

    with ThreadPoolExecutor(len(devices)) as pool:
        return dict(zip(devices, pool.map(one, devices), strict=True))


def _device(row: DeviceRow, accuracy: float) -> DemoDevice:
    return DemoDevice(
        device_id=row.device_id,
        profile=row.profile or "?",
        bundle=row.bundle or "-",
        provider=row.provider,
        provider_summary=row.provider_summary,
        providers_not_chosen=row.providers_not_chosen,
        verified=row.verified,
        p50_ms=row.p50_ms,
        p95_ms=row.p95_ms,
        requests=row.requests or 0,
        accuracy=accuracy,
        state=row.state,
    )
