"""Model quality on real agents (subprocesses) over a real Mosquitto with real bundles: drift on shifted
traffic, field accuracy over MQTT, a subtly wrong regression bundle caught by its golden check and rolled back,
a disagreeing shadow reported but never served, and probe traffic on a quiet device."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import publish_desired
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import pack_bundle, unpack_bundle
from edgefleet.core.messages import Desired, Telemetry
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.quality.golden import GoldenSet, argmax_agreement
from edgefleet.core.quality.output_rules import sqnr_db
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.drift import shifted
from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.models.quality_bundles import (
    PROFILE,
    convert_digits_like,
)
from support.paths import DIGITS
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]
WINDOW = 256


def _telemetry_after(watcher: FleetWatcher, device: str, since: float, what: str, timeout: float = 60.0) -> Telemetry:
    """The second report stamped after `since`: it was computed after everything sent before `since`."""

    def check() -> Telemetry | None:
        later = [t for t in watcher.telemetry if t.device_id == device and t.ts > since]
        return later[1] if len(later) >= 2 else None

    return watcher.wait_for(what, check, timeout)


# --- drift and field accuracy (the digits CNN)
def _eval() -> tuple[np.ndarray, np.ndarray]:
    with np.load(DIGITS / "eval.npz") as data:
        return data["input"], data["labels"]


@pytest.mark.slow
def test_shifted_traffic_raises_drift_within_one_window_and_normal_traffic_does_not(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    device = "dev-drift"
    # a whole core and room for a whole window: every request of a stream is binned, none skipped
    drift = ("--drift-window", str(WINDOW), "--drift-min-samples", str(WINDOW), "--drift-cpu", "1.0",
             "--drift-queue", str(WINDOW))  # fmt: skip
    start_agent(device, extra=(*drift, "--probe-rate", "0"))
    bundle_id = deploy_to(host, topics, demo_bundles[PROFILE], devices=(device,))
    watcher.serving(device, bundle_id)
    remote = RemoteModel(host, topics, device)
    images, labels = _eval()
    rng = np.random.default_rng(11)

    def window_of(stream: np.ndarray) -> dict[str, tuple[float, str, int]]:
        answers = remote.infer_many([{"input": x} for x in stream], window=16)
        assert all(a.ok for a in answers)
        report = _telemetry_after(watcher, device, time.time(), "drift over the window")
        return {d.name: (d.psi, d.band, d.samples) for d in report.drift}

    in_distribution = []
    for _ in range(3):  # random draws from the data the bundle's reference describes
        scores = window_of(images[rng.choice(len(images), WINDOW)])
        assert {s for _, _, s in scores.values()} == {WINDOW}
        in_distribution.append(max(psi for psi, _, _ in scores.values()))
    assert all(psi <= 0.25 for psi in in_distribution), f"false alarms: worst PSI per window {in_distribution}"

    for shift, feature in (("brightness", "input"), ("noise", "input"), ("inverted", "input"), ("class-mix", "logits")):
        scores = window_of(shifted(shift, images, labels, rng, WINDOW))
        psi, band, samples = scores[feature]
        assert psi > 0.25 and band == "drift" and samples == WINDOW, (shift, scores)


def test_field_accuracy_over_mqtt_counts_each_sample_for_the_bundle_that_answered(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    device = "dev-mqtt-feedback"
    start_agent(device, extra=("--probe-rate", "0"))
    bundle_id = deploy_to(host, topics, demo_bundles[PROFILE], devices=(device,))
    watcher.serving(device, bundle_id)
    images, labels = _eval()
    remote = RemoteModel(host, topics, device)
    requests = [{"input": x} for x in images[:30]]
    answers = remote.infer_many(requests)
    predicted = [int(a.outputs["logits"].to_array().argmax()) for a in answers]
    truth = [int(v) for v in labels[:30]]
    truth[:5] = [(p + 1) % 10 for p in predicted[:5]]  # five labels the model certainly got wrong
    sent_ids = [a.request_id for a in answers]
    for request_id, label in zip(sent_ids, truth, strict=True):
        remote.feedback(request_id, [label])
    expected = float(np.mean(np.array(predicted) == np.array(truth)))
    report = watcher.wait_for(
        "field accuracy from MQTT feedback",
        lambda: next((t for t in watcher.telemetry if t.device_id == device and t.field_samples == 30), None),
    )
    assert report.bundle_id == bundle_id and report.field_accuracy == pytest.approx(expected) and expected <= 25 / 30


# --- a regression model whose new bundle is subtly wrong
def _regression_model(path: Path, bias: float) -> Path:
    weights = np.array([[0.5], [-1.0], [2.0], [0.25]], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "regression",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([0.1 + bias], np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def regression_bundles(
    tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey, keys: tuple[Path, Path]
) -> tuple[Path, Path, float]:
    """(v1, v2, bias): v2 holds the same golden set as v1 but a model whose output is shifted by `bias`, half the
    bundle-wide max-abs tolerance: a build bug no argmax and no max-abs check would notice."""
    work = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(3)
    for name, count in (("calib", 64), ("eval", 128)):
        np.savez(work / f"{name}.npz", x=rng.normal(size=(count, 1, 4)).astype(np.float32))
    model = _regression_model(work / "y.onnx", 0.0)
    v1 = convert_digits_like(model, work / "calib.npz", work / "eval.npz", work / "out", signing_key, "regressor", "1",
                  min_sqnr_db=90.0)  # fmt: skip
    unpacked = work / "v1"
    manifest = unpack_bundle(v1, unpacked, TrustedKeys.load([keys[1]]))
    bias = 0.5 * manifest.golden.max_abs_error
    _regression_model(unpacked / manifest.model_path, bias)
    from edgefleet.core.bundle.archive import describe_files

    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    v2_manifest = manifest.model_copy(
        update={"model_version": "2", "bundle_id": f"{manifest.bundle_id}-biased", "files": describe_files(sources)}
    )
    v2 = work / "regressor-2.bundle"
    pack_bundle(v2, v2_manifest, sources, signing_key)
    return v1, v2, bias


@pytest.mark.slow
def test_a_regression_bundle_with_a_bias_shift_fails_its_golden_check_on_the_device_and_is_rolled_back(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    regression_bundles: tuple[Path, Path, float], keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    v1, v2, bias = regression_bundles
    manifest = unpack_bundle(v2, tmp_path / "v2", TrustedKeys.load([keys[1]]))
    golden = GoldenSet.load(tmp_path / "v2" / manifest.golden.path, manifest.inputs, manifest.outputs)
    session = ort.InferenceSession(str(tmp_path / "v2" / manifest.model_path), providers=["CPUExecutionProvider"])
    outputs = np.stack([session.run(None, {"x": x})[0] for x in golden.inputs.inputs["x"]])
    assert argmax_agreement(outputs, golden.reference["y"]) == 1.0  # the old check: blind on one value per sample
    assert np.max(np.abs(outputs - golden.expected["y"])) < manifest.golden.max_abs_error  # inside the old tolerance

    device = "dev-regression"
    start_agent(device, extra=("--probe-rate", "0"))
    first = deploy_to(host, topics, v1, devices=(device,))
    watcher.serving(device, first)
    report = watcher.wait_for(
        "golden scores on install",
        lambda: next((t for t in watcher.telemetry if t.device_id == device and t.golden_scores), None),
    )
    (score,) = report.golden_scores
    assert score.output == "y" and score.rule == "continuous" and score.passed and score.detail["sqnr_db"] >= 80

    second = deploy_to(host, topics, v2, devices=(device,))
    event = watcher.event(device, "refused", bundle_id=second, timeout=60)  # refused at install
    assert "leave the golden tolerance" in event.detail and "SQNR" in event.detail, event.detail  # on every provider
    status = watcher.serving(device, first)
    assert slot_of(status).active_bundle == first and bias > 0


@pytest.mark.slow
def test_a_disagreeing_shadow_is_reported_with_its_agreement_and_never_answers_a_client(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], negated_digits_bundle: Path, host_keys: HostKeys,
) -> None:  # fmt: skip
    device = "dev-shadow"
    start_agent(device, extra=("--shadow-share", "1.0", "--shadow-cpu", "1.0", "--probe-rate", "0"))
    served = deploy_to(host, topics, demo_bundles[PROFILE], devices=(device,))
    watcher.serving(device, served)
    shadow_manifest, _ = publish_bundle(host, topics, negated_digits_bundle, block_size=16 * 1024)
    current = watcher.status[device]
    desired = Desired(
        bundle_id=served, model_name="digits-cnn", model_version="1", profile=PROFILE,
        shadow_bundle_id=shadow_manifest.bundle_id,
    )  # fmt: skip
    publish_desired(host, topics, host_keys, desired, device=device, wait=10)  # signed by the ops key
    watcher.wait_for(
        "the shadow running",
        lambda: any(t.device_id == device and t.shadow is not None for t in watcher.telemetry),
        timeout=90,
    )

    images, _ = _eval()
    session = ort.InferenceSession(str(DIGITS / "digits_cnn.onnx"), providers=["CPUExecutionProvider"])
    answers = RemoteModel(host, topics, device).infer_many([{"input": x} for x in images[:60]], window=4)
    for answer, x in zip(answers, images[:60], strict=True):
        assert answer.ok and answer.bundle_id == served
        got, reference = answer.outputs["logits"].to_array(), session.run(None, {"input": x})[0]
        # The served build's answer (FP32 or INT8, whichever the converter chose on this machine) stays near the
        # FP32 reference; the negated shadow's answer would sit far below 0 dB.
        assert sqnr_db(got, reference) >= 20.0, sqnr_db(got, reference)

    def mirrored() -> Telemetry | None:
        reports = [t for t in watcher.telemetry if t.device_id == device and t.shadow and t.shadow.requests >= 30]
        return reports[-1] if reports else None

    report = watcher.wait_for("shadow figures", mirrored, timeout=60)
    shadow = report.shadow
    assert shadow is not None and shadow.bundle_id == shadow_manifest.bundle_id
    assert shadow.agreement is not None and shadow.agreement < 0.2
    (per_output,) = shadow.per_output
    assert per_output.rule == "class-agreement" and not per_output.passed
    assert shadow.latency is not None and shadow.latency.count == shadow.requests
    assert shadow.requests + shadow.dropped >= 60 - 1 and shadow.failures == 0
    status = watcher.status[device]
    assert (
        slot_of(status).active_bundle == served == slot_of(current).active_bundle
    )  # the shadow was never committed nor served


# --- a quiet device
def test_a_quiet_device_produces_probe_traffic_so_its_latency_can_be_judged(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    device = "dev-quiet"
    start_agent(device, extra=("--probe-rate", "5"))
    bundle_id = deploy_to(host, topics, demo_bundles[PROFILE], devices=(device,))
    watcher.serving(device, bundle_id)
    report = watcher.wait_for(
        "probe traffic",
        lambda: next(
            (t for t in watcher.telemetry if t.device_id == device and t.probe_requests > 0 and t.latency.count), None
        ),
    )
    assert report.requests == 0 and report.latency.p95_ms is not None
