"""Quality guardrails with real agents (subprocesses) on a real Mosquitto and the real control plane: the device
measures (probe traffic, shadow agreement), the control plane judges and acts.

- A quiet canary (no client traffic at all) is judged from the agent's probe traffic: latency and errors come
  back judged, not passed blind.
- A canary answering worse on labelled feedback (half its classes rotated) is rolled back by the field-accuracy
  guardrail, with the golden guardrail switched off.
- A rollout with a shadow phase whose candidate disagrees with the served model (its logits negated) stops
  before any device serves it; the devices keep serving, the shadow is dropped."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.models.quality_bundles import negated_digits_bundle  # noqa: F401  (a module fixture)
from support.paths import DIGITS
from support.rollouts.agents import Traffic, less_accurate_bundle
from support.rollouts.control_plane import control_plane, enroll, finished, publish, wait_until
from support.servers.brokers import MosquittoBroker
from support.slots import slot_of

PROFILE = "intel-x86-vnni"
THRESHOLDS = {"max_latency_factor": 10.0, "latency_slack_ms": 2.0, "max_error_rate": 0.05, "min_requests": 10}
TIMING = {"baseline_s": 5.0, "observe_s": 4.0, "install_timeout_s": 90.0, "report_timeout_s": 30.0, "min_reports": 2}


@pytest.mark.slow
def test_a_quiet_canary_is_judged_from_its_probe_traffic(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, topics: Topics,
    watcher: FleetWatcher, demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey,
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    devices = ["quiet-0", "quiet-1"]
    for device in devices:
        start_agent(device, groups=("quiet",), telemetry_interval=0.5, extra=("--probe-rate", "20"))
    v1 = deploy_to(host, topics, demo_bundles[PROFILE], groups=("quiet",))
    for device in devices:
        watcher.serving(device, v1, timeout=90)
    v2 = derive_bundle(demo_bundles[PROFILE], tmp_path, signing_key, TrustedKeys.load([keys[1]]), model_version="2")
    with control_plane(mosquitto.url, tmp_path) as plane:
        manifest = publish(host, plane.store, v2)
        wait_until("telemetry", lambda: all(plane.store.latest_telemetry().get((d, "default")) for d in devices))
        publish(host, plane.store, demo_bundles[PROFILE])  # the host's record of v1: the rollback target
        enroll(plane.store, devices, ["quiet"], profile=None)
        spec = make_spec(group="quiet", bundles=[bundle_ref(manifest)], canary="1", waves=["100%"],
                         thresholds=THRESHOLDS, timing=TIMING)  # fmt: skip
        doc = finished(plane.store, prepare_rollout(plane.store, spec).id, timeout=240)
    assert doc.state == "succeeded", (doc.outcome, {d: p.reason for d, p in doc.devices.items()})
    for progress in doc.devices.values():
        verdict = {f.criterion: f.ok for f in progress.findings}
        assert verdict["latency"] is True and verdict["errors"] is True, progress.findings
        assert progress.observed is not None and progress.observed.requests == 0, "no client ever called"
        assert progress.observed.probe_requests >= 10 and progress.baseline is not None
        assert progress.baseline.probe_requests >= 10


@pytest.mark.slow
def test_a_disagreeing_shadow_stops_the_rollout_before_any_device_serves_it(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, topics: Topics,
    watcher: FleetWatcher, demo_bundles: dict[str, Path], tmp_path: Path,
    negated_digits_bundle: Path,  # noqa: F811
) -> None:  # fmt: skip
    devices = ["shadowed-0", "shadowed-1"]
    for device in devices:
        start_agent(device, groups=("shadowed",), telemetry_interval=0.5,
                    extra=("--shadow-share", "1.0", "--shadow-cpu", "1.0"))  # fmt: skip
    v1 = deploy_to(host, topics, demo_bundles[PROFILE], groups=("shadowed",))
    for device in devices:
        watcher.serving(device, v1, timeout=90)
    with control_plane(mosquitto.url, tmp_path) as plane, Traffic(host, topics, devices):
        candidate = publish(host, plane.store, negated_digits_bundle)
        wait_until("telemetry", lambda: all(plane.store.latest_telemetry().get((d, "default")) for d in devices))
        publish(host, plane.store, demo_bundles[PROFILE])
        enroll(plane.store, devices, ["shadowed"], profile=None)
        spec = make_spec(group="shadowed", bundles=[bundle_ref(candidate)], canary="1", waves=["100%"],
                         thresholds=THRESHOLDS, timing=TIMING,
                         shadow={"observe_s": 3.0, "timeout_s": 120.0, "min_requests": 30})  # fmt: skip
        doc = finished(plane.store, prepare_rollout(plane.store, spec).id, timeout=240)
    assert doc.state == "rolled-back" and doc.shadow is not None and doc.shadow.state == "failed", doc.outcome
    assert "shadow agreement" in doc.outcome and "is below 0.99" in doc.outcome
    (canary,) = doc.shadow.devices.values()
    assert canary.agreement is not None and canary.agreement < 0.5 and canary.requests >= 30
    assert [w.state for w in doc.waves] == ["pending", "pending"]
    for device in devices:
        assert slot_of(watcher.status[device]).active_bundle == v1, "nobody served the candidate"
        assert not [e for e in watcher.events if e.device_id == device and e.kind == "committed"
                    and e.bundle_id == candidate.bundle_id]  # fmt: skip


class LabelledTraffic(Traffic):
    """Inference requests whose true labels the client knows and sends back as feedback (field accuracy)."""

    def __init__(self, host: Connection, topics: Topics, devices: list[str]) -> None:
        super().__init__(host, topics, devices)
        with np.load(DIGITS / "eval.npz") as data:
            self.labelled = [({"input": data["input"][i]}, int(data["labels"][i])) for i in range(16)]

    def _run(self) -> None:
        while not self._stop.is_set():
            for remote in self.remotes:
                try:
                    answers = remote.infer_many([x for x, _ in self.labelled], window=4, timeout=5.0)
                    for answer, (_, label) in zip(answers, self.labelled, strict=True):
                        remote.feedback(answer.request_id, [label])
                    self.sent += len(answers)
                except BrokerError:
                    pass  # a device busy installing may answer late; the next round goes on
            self._stop.wait(0.1)


@pytest.mark.slow
def test_a_canary_answering_worse_on_labelled_feedback_is_rolled_back_by_field_accuracy(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, topics: Topics,
    watcher: FleetWatcher, demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey,
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    devices = ["labelled-0", "labelled-1"]
    for device in devices:
        start_agent(device, groups=("labelled",), telemetry_interval=0.5)
    worse = less_accurate_bundle(demo_bundles[PROFILE], tmp_path, signing_key, TrustedKeys.load([keys[1]]), "2")
    # Golden checks off: this rollout is caught by what the applications say about the answers, nothing else.
    thresholds = THRESHOLDS | {"max_golden_drop": None, "min_field_samples": 30, "max_field_accuracy_drop": 0.05}
    with control_plane(mosquitto.url, tmp_path) as plane:
        # v1 goes out while the control plane listens: it stores each device's commit, which makes v1 the
        # rollback target (a bundle the store published and the device is recorded as having committed)
        v1 = deploy_to(host, topics, demo_bundles[PROFILE], groups=("labelled",))
        for device in devices:
            watcher.serving(device, v1, timeout=90)
        with LabelledTraffic(host, topics, devices):
            manifest = publish(host, plane.store, worse)

            def labelled() -> bool:
                latest = plane.store.latest_quality()
                return all((d, "default") in latest and latest[(d, "default")].field_samples >= 30 for d in devices)

            wait_until("feedback on every device", labelled, timeout=120)
            publish(host, plane.store, demo_bundles[PROFILE])
            enroll(plane.store, devices, ["labelled"], profile=None)
            spec = make_spec(group="labelled", bundles=[bundle_ref(manifest)], canary="1", waves=["100%"],
                             thresholds=thresholds, timing=TIMING)  # fmt: skip
            doc = finished(plane.store, prepare_rollout(plane.store, spec).id, timeout=240)
    assert doc.state == "rolled-back", (doc.outcome, {d: p.reason for d, p in doc.devices.items()})
    assert "field accuracy" in doc.waves[0].verdict and "is below baseline" in doc.waves[0].verdict
    canary = doc.waves[0].devices[0]
    observed, baseline = doc.devices[canary].observed, doc.devices[canary].baseline
    assert observed is not None and baseline is not None and baseline.field_accuracy is not None
    assert observed.field_accuracy is not None and observed.field_accuracy < baseline.field_accuracy - 0.2
    watcher.serving(canary, v1, timeout=60)
