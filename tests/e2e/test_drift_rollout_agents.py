"""The drift guardrail (`rollout start --max-drift-psi`) with real agents computing PSI on live inference traffic,
a real Mosquitto and the real control plane.

- One rollout, two waves: the canary's clients send in-distribution digits and its wave passes on a judged drift
  score; the next wave's clients send inverted digits, its devices report drift above the limit on the new bundle,
  and the engine rolls the rollout back.
- A canary with too few live samples behind its drift scores is not passed: its wave stays pending until its time
  is up, then fails with "no data for drift"."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.rollout.plan import RolloutDoc
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.paths import DIGITS
from support.rollouts.control_plane import control_plane, enroll, finished, publish, rollout, wait_until
from support.servers.brokers import MosquittoBroker

PROFILE = "intel-x86-vnni"
PSI_LIMIT, SAMPLES = 0.25, 128
# A window that fills in seconds under test traffic (binning may use half a core, nothing is skipped).
DRIFT_FLAGS = ("--drift-window", "256", "--drift-min-samples", "32", "--drift-cpu", "0.5", "--drift-queue", "256")
THRESHOLDS = {
    "max_latency_factor": 10.0, "latency_slack_ms": 2.0, "max_error_rate": 0.05, "min_requests": 10,
    "max_drift_psi": PSI_LIMIT, "min_drift_samples": SAMPLES,
}  # fmt: skip
TIMING = {"baseline_s": 5.0, "observe_s": 4.0, "install_timeout_s": 90.0, "report_timeout_s": 30.0, "min_reports": 2}


def _streams() -> dict[str, list[dict[str, np.ndarray]]]:
    """In-distribution digits (the evaluation set, shuffled) and the same digits inverted (ink becomes paper)."""
    with np.load(DIGITS / "eval.npz") as data:
        images = data["input"][np.random.default_rng(3).permutation(len(data["input"]))]
    return {"clean": [{"input": x} for x in images], "inverted": [{"input": 1.0 - x} for x in images]}


class RoutedTraffic:
    """Live requests to every device, each from the stream it is routed to, all the time."""

    def __init__(self, host: Connection, topics: Topics, routes: dict[str, str]) -> None:
        self.streams = {name: itertools.cycle(samples) for name, samples in _streams().items()}
        self.routes = dict(routes)
        self.remotes = {device: RemoteModel(host, topics, device) for device in routes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RoutedTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for remote in self.remotes.values():
            remote.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for device, remote in self.remotes.items():
                stream = self.streams[self.routes[device]]
                with contextlib.suppress(BrokerError):  # a device busy installing may answer late; go on
                    remote.infer_many([next(stream) for _ in range(16)], window=8, timeout=5.0)
            self._stop.wait(0.05)


def _drift_finding(doc: RolloutDoc, device: str) -> tuple[bool | None, str]:
    (finding,) = [f for f in doc.devices[device].findings if f.criterion == "drift"]
    return finding.ok, finding.detail


def _start(start_agent: Callable[..., AgentProcess], devices: list[str], group: str, *extra: str) -> None:
    for device in devices:
        start_agent(device, groups=(group,), telemetry_interval=0.5, extra=(*DRIFT_FLAGS, *extra))


@pytest.mark.slow
def test_a_wave_whose_traffic_drifts_is_rolled_back_and_a_wave_with_clean_traffic_passes(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, topics: Topics,
    watcher: FleetWatcher, demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey,
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    devices = [f"drift-{i}" for i in range(3)]
    _start(start_agent, devices, "drifting")
    v2 = derive_bundle(demo_bundles[PROFILE], tmp_path, signing_key, TrustedKeys.load([keys[1]]), model_version="2")
    with control_plane(mosquitto.url, tmp_path) as plane:
        # v1 goes out while the control plane listens: it stores each device's commit, which makes v1 the
        # rollback target (a bundle the store published and the device is recorded as having committed)
        v1 = deploy_to(host, topics, demo_bundles[PROFILE], groups=("drifting",))
        for device in devices:
            watcher.serving(device, v1, timeout=90)
        manifest = publish(host, plane.store, v2)
        spec = make_spec(group="drifting", bundles=[bundle_ref(manifest)], canary="1", waves=["100%"],
                         thresholds=THRESHOLDS, timing=TIMING)  # fmt: skip
        with RoutedTraffic(host, topics, {d: "clean" for d in devices}) as traffic:
            wait_until("telemetry", lambda: all(plane.store.latest_telemetry().get((d, "default")) for d in devices))
            publish(host, plane.store, demo_bundles[PROFILE])  # the host's record of v1: the rollback target
            enroll(plane.store, devices, ["drifting"], profile=None)
            rollout_id = prepare_rollout(plane.store, spec).id
            waves = [w.devices for w in rollout(plane.store, rollout_id).waves]
            assert [len(w) for w in waves] == [1, 2], waves
            for device in waves[1]:  # the second wave's clients see another world
                traffic.routes[device] = "inverted"
            doc = finished(plane.store, rollout_id, timeout=300)
    assert doc.state == "rolled-back", (doc.outcome, {d: p.reason for d, p in doc.devices.items()})
    assert [w.state for w in doc.waves] == ["passed", "failed"], [(w.state, w.verdict) for w in doc.waves]
    (canary,) = waves[0]
    ok, detail = _drift_finding(doc, canary)
    assert ok is True and f"within the limit {PSI_LIMIT:g}" in detail, detail
    for device in waves[1]:
        ok, detail = _drift_finding(doc, device)
        observed = doc.devices[device].observed
        if ok is False and observed is not None and observed.drift_psi is not None:
            assert observed.drift_psi > PSI_LIMIT and observed.drift_samples >= SAMPLES, observed
            assert "exceeds the limit" in detail
    assert any(_drift_finding(doc, d)[0] is False for d in waves[1]), [_drift_finding(doc, d) for d in waves[1]]
    assert "drift" in doc.waves[1].verdict, doc.waves[1].verdict
    for device in devices:
        watcher.serving(device, v1, timeout=90)


@pytest.mark.slow
def test_a_canary_with_too_few_drift_samples_is_never_passed_blind(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, topics: Topics,
    watcher: FleetWatcher, demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey,
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    devices = [f"thin-{i}" for i in range(2)]
    _start(start_agent, devices, "thin", "--probe-rate", "20")  # latency and errors are judged from probes
    v2 = derive_bundle(demo_bundles[PROFILE], tmp_path, signing_key, TrustedKeys.load([keys[1]]), model_version="2")
    clean = _streams()["clean"]
    with control_plane(mosquitto.url, tmp_path) as plane:
        v1 = deploy_to(host, topics, demo_bundles[PROFILE], groups=("thin",))  # its commits recorded (see above)
        for device in devices:
            watcher.serving(device, v1, timeout=90)
        manifest = publish(host, plane.store, v2)
        wait_until("telemetry", lambda: all(plane.store.latest_telemetry().get((d, "default")) for d in devices))
        publish(host, plane.store, demo_bundles[PROFILE])
        enroll(plane.store, devices, ["thin"], profile=None)
        spec = make_spec(group="thin", bundles=[bundle_ref(manifest)], canary="1", waves=["100%"],
                         thresholds=THRESHOLDS, timing=TIMING)  # fmt: skip
        rollout_id = prepare_rollout(plane.store, spec).id
        (canary,) = rollout(plane.store, rollout_id).waves[0].devices
        watcher.serving(canary, manifest.bundle_id, timeout=120)
        remote = RemoteModel(host, topics, canary)
        try:
            answers = remote.infer_many(clean[:60], window=8)  # scored (32 or more), but fewer than SAMPLES
        finally:
            remote.close()
        assert all(a.ok and a.bundle_id == manifest.bundle_id for a in answers)

        def pending_on_thin_data() -> str | None:
            progress = rollout(plane.store, rollout_id).devices[canary]
            detail = next((f.detail for f in progress.findings if f.criterion == "drift"), "")
            return detail if detail.startswith("not judged: 60 live samples behind the drift scores") else None

        detail = wait_until("the canary's drift finding pending on too few samples", pending_on_thin_data, 120)
        assert f"{SAMPLES} needed" in detail, detail
        assert rollout(plane.store, rollout_id).waves[0].state != "passed"
        doc = finished(plane.store, rollout_id, timeout=240)
    assert doc.state == "rolled-back", doc.outcome
    assert doc.waves[0].state == "failed" and doc.waves[1].state == "pending", doc.waves
    ok, detail = _drift_finding(doc, canary)
    assert ok is False and detail.startswith("no data for drift: 60 live samples"), detail
    watcher.serving(canary, v1, timeout=90)
