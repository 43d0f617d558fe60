"""A user's own model onto a fleet that serves another one, on the rollout's default guardrails, with real agents:
devices serving the digits CNN get the converter's dynamic-shape CNN (models/testbed/dynamic_cnn.onnx, another
model), converted with the converter's defaults. The rollout succeeds, judged against the new model's own build
scaled to each device, never against the digits CNN's speed; rolled back by the operator, the same signed bundle
rolls out again and succeeds (the device's version floor lets that exact bundle in again); a build of it that runs
at least 2x slower on the devices than its build, scaled, is rolled back on latency, and says which flag would
change that."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.control.operations import Operator, rollback_rollout
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.latency import scale_to_device
from edgefleet.control.rollout.plan import BundleRef, RolloutDoc
from edgefleet.control.store import Store
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.host_cpu import as_this_host
from support.paths import REPO
from support.rollouts.control_plane import control_plane, enroll, finished, publish, wait_until
from support.servers.brokers import MosquittoBroker

GROUP = "own-model"
DEVICES = ["nm-0", "nm-1"]
PROFILE = "intel-x86-vnni"
TESTBED = REPO / "models" / "testbed"
PLUGIN = REPO / "tests" / "support" / "fault_backend_plugin.py"
# Shorter than the defaults so the test fits CI (the baseline still long enough for a quiet device's probes, one
# every 0.5 s, to reach the 20 requests a latency baseline needs); the thresholds (the guardrails) are the defaults.
TIMING = {"baseline_s": 20.0, "observe_s": 12.0, "install_timeout_s": 120.0, "report_timeout_s": 60.0}


def _convert_own_model(out: Path, key: SigningKey) -> Path:
    """dynamic_cnn with the converter's defaults (ONNX files, as the demo bundles: the slow build below wraps the
    ONNX Runtime session)."""
    from edgefleet.converter import ConvertRequest, convert

    (result,) = convert(
        ConvertRequest(
            model=TESTBED / "dynamic_cnn.onnx", profiles=[as_this_host(get_profile(PROFILE))],
            calib=TESTBED / "dynamic_cnn_calib.npz", eval=TESTBED / "dynamic_cnn_eval.npz", out=out, key=key,
            name="dynamic-cnn", version="1", runtimes=("onnxruntime",),
        )
    )  # fmt: skip
    assert result.bundle, result.error
    return Path(result.bundle)


def _roll_out(store: Store, ref: BundleRef) -> RolloutDoc:
    spec = make_spec(group=GROUP, bundles=[ref], canary="1", waves=["100%"], timing=TIMING)
    return finished(store, prepare_rollout(store, spec).id, timeout=400)


def _back_on(watcher: FleetWatcher, bundle_id: str) -> None:
    for device in DEVICES:
        watcher.serving(device, bundle_id, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_new_model_rolls_out_on_defaults_retries_after_a_rollback_and_a_slower_build_is_rolled_back(
    start_agent: Callable[..., AgentProcess], mosquitto: MosquittoBroker, host: Connection, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, keys: tuple[Path, Path],
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    delay_file = tmp_path / "delay-ms"
    delay_file.write_text("0")
    env = {"EDGEFLEET_BACKENDS": str(PLUGIN), "EDGEFLEET_FAULT": "slow", "EDGEFLEET_FAULT_DELAY_FILE": str(delay_file)}
    for device in DEVICES:
        start_agent(device, groups=(GROUP,), telemetry_interval=0.5, env=env)
    own = _convert_own_model(tmp_path / "own", signing_key)

    with control_plane(mosquitto.url, tmp_path) as plane:
        store = plane.store
        wait_until("status from every agent", lambda: all(store.device(d) for d in DEVICES))
        enroll(store, DEVICES, [GROUP], profile=None)
        digits_manifest = publish(host, store, demo_bundles[PROFILE])
        serving = _roll_out(store, bundle_ref(digits_manifest))  # the fleet serves the digits CNN
        assert serving.state == "succeeded", [e.message for e in serving.log]
        digits = digits_manifest.bundle_id
        _back_on(watcher, digits)
        own_manifest = publish(host, store, own)
        assert own_manifest.model_name != "digits-cnn"

        started = time.monotonic()
        first = _roll_out(store, bundle_ref(own_manifest))
        first_s = time.monotonic() - started
        assert first.state == "succeeded", [e.message for e in first.log]
        for device in DEVICES:
            latency = next(f for f in first.devices[device].findings if f.criterion == "latency")
            baseline = first.devices[device].baseline
            assert latency.ok is True and f"scaled to this device by its previous bundle {digits}" in latency.detail, (
                latency.detail,
                baseline,
            )

        rollback_rollout(store, Operator.shell(), first.id)
        _back_on(watcher, digits)

        started = time.monotonic()
        again = _roll_out(store, bundle_ref(own_manifest))  # the same signed bundle
        again_s = time.monotonic() - started
        assert again.state == "succeeded", [e.message for e in again.log]
        _back_on(watcher, own_manifest.bundle_id)

        # The slower build: busy for twice the most this device was expected or seen to take per request, so it
        # runs at least 2x slower on the device than its own build scaled to the device.
        facts = BundleFacts.model_validate_json(store.bundle_facts(own_manifest.bundle_id) or "")
        digits_facts = BundleFacts.model_validate_json(store.bundle_facts(digits) or "")
        slowest = 0.0
        for device in DEVICES:
            progress = again.devices[device]
            scaled = scale_to_device(
                progress.baseline, facts.measured_latency(PROFILE), digits_facts.measured_latency(PROFILE),
                make_spec(group=GROUP, bundles=[bundle_ref(own_manifest)]).thresholds,
                (facts.measured_spread(PROFILE), digits_facts.measured_spread(PROFILE)),
            )  # fmt: skip
            assert scaled is not None and progress.observed is not None and progress.observed.p50_ms is not None
            slowest = max(slowest, scaled.expected_ms, progress.observed.p50_ms)
        delay_file.write_text(f"{2 * slowest:.4f}")
        rollback_rollout(store, Operator.shell(), again.id)
        _back_on(watcher, digits)

        slow = derive_bundle(
            own,
            tmp_path,
            signing_key,
            trusted,
            model_version="2",
            providers=["plugin-fault:A"],
            bundle_id=f"{own_manifest.bundle_id}-slower",
        )
        slow_manifest = publish(host, store, slow)
        started = time.monotonic()
        rolled = _roll_out(store, bundle_ref(slow_manifest))
        slow_s = time.monotonic() - started
        assert rolled.state == "rolled-back", [e.message for e in rolled.log]
        verdict = rolled.waves[0].verdict
        assert "another model (digits-cnn → dynamic-cnn)" in verdict and "--max-latency-factor" in verdict, verdict
        assert f"scaled to this device by its previous bundle {digits}" in verdict, verdict
        canary = rolled.waves[0].devices[0]
        watcher.event(canary, "committed", bundle_id=slow_manifest.bundle_id, timeout=5)
        _back_on(watcher, digits)
    print(f"new model {first_s:.1f} s, the same bundle again {again_s:.1f} s, slower build rolled back {slow_s:.1f} s")
    print(f"the slower build's verdict: {verdict}")
