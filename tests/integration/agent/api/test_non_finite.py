"""NaN and Infinity on the local API: refused in inputs unless the model declares it takes them, never written as
invalid JSON in answers, and never counted by drift statistics. A real model (the demo CNN) on ONNX Runtime."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgefleet.agent.api import InferenceService, ServiceConfig
from edgefleet.agent.quality.drift import DriftConfig, DriftMonitor, load_reference
from edgefleet.agent.runtime import LoadedModel
from edgefleet.core.errors import DataError

from support.local_api import call, json_body, npy
from support.runtime import unpack

V1 = "/v1/models/digits-cnn/infer"
V2 = "/v2/models/digits-cnn/infer"


def strict_json(body: bytes) -> Any:
    """Parse as JSON proper: the tokens NaN and Infinity are not JSON."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"answer holds the non-JSON token {token}: {body[:200]!r}")

    return json.loads(body, parse_constant=refuse)


def message(body: bytes) -> str:
    """The error message of a /v1 ({"error": {"kind", "message"}}) or OIP ({"error": "..."}) answer."""
    error = strict_json(body)["error"]
    return str(error["message"] if isinstance(error, dict) else error)


@pytest.fixture(scope="module")
def plain(demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    bundle_dir, manifest = unpack(demo_bundles["generic-x86-64"], keys[1], tmp_path_factory.mktemp("nf") / "b")
    return bundle_dir, manifest


@pytest.fixture(scope="module")
def service(plain) -> InferenceService:  # type: ignore[no-untyped-def]
    with InferenceService([LoadedModel(*plain, 1)], ServiceConfig(port=0)) as svc:
        yield svc


def oip_binary(x: np.ndarray, binary_output: bool) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": binary_output}}],
    }).encode()  # fmt: skip
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return header + x.astype(np.float32).tobytes(), headers


def sample(value: float) -> np.ndarray:
    x = np.zeros((1, 1, 8, 8), np.float32)
    x[0, 0, 3, 3] = value
    return x


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_input_is_refused_on_every_format_naming_the_input(
    service: InferenceService, value: float
) -> None:
    for path, body, headers in (
        (V1, npy(sample(value)), {"Content-Type": "application/x-npy"}),
        (V2, *oip_binary(sample(value), binary_output=True)),
    ):
        status, _, answer = call(service, "POST", path, body, headers)
        assert status == 400, answer
        assert "input 'input' holds NaN or Infinity" in message(answer)


def test_nan_written_as_a_json_token_is_not_json(service: InferenceService) -> None:
    body = json_body(sample(0.0)).replace(b"0.0", b"NaN", 1)
    document = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.0] * 64}]}
    oip = json.dumps(document).replace("0.0", "Infinity", 1).encode()
    for path, payload in ((V1, body), (V2, oip)):
        status, _, answer = call(service, "POST", path, payload, {"Content-Type": "application/json"})
        assert status == 400 and "is not JSON" in message(answer), answer


def test_a_model_that_takes_nan_answers_in_binary_and_refuses_json_naming_the_output(plain) -> None:  # type: ignore[no-untyped-def]
    bundle_dir, manifest = plain
    spec = manifest.inputs[0].model_copy(update={"non_finite": True})
    declared = manifest.model_copy(update={"inputs": [spec]})
    model = LoadedModel(bundle_dir, declared, 1)
    real_run = model.run

    def run_carrying_nan(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Whether a NaN pixel survives this CNN depends on the CPU's kernels: ONNX Runtime's ReLU is max(x, 0),
        # and on some x86 paths max(NaN, 0) is 0 (a CI host answered finite logits; this machine answers NaN).
        # The API's handling of a NaN answer is what is under test, so the answer carries one whatever the CPU.
        outputs = real_run(feeds)
        if any(np.isnan(v).any() for v in feeds.values()):
            outputs = {name: np.full_like(value, np.nan) for name, value in outputs.items()}
        return outputs

    model.run = run_carrying_nan  # type: ignore[method-assign]
    with InferenceService([model], ServiceConfig(port=0)) as svc:
        status, _, answer = call(svc, "POST", V2, *oip_binary(sample(np.nan), binary_output=True))
        assert status == 200
        header_length = len(answer) - 10 * 4
        assert np.isnan(np.frombuffer(answer[header_length:], np.float32)).all()
        for path, body, headers in (
            (V2, *oip_binary(sample(np.nan), binary_output=False)),
            (V1, npy(sample(np.nan)), {"Content-Type": "application/x-npy", "Accept": "application/json"}),
        ):
            status, _, answer = call(svc, "POST", path, body, headers)
            assert status == 406, answer
            said = message(answer)
            assert "output 'logits' holds NaN or Infinity, which JSON cannot carry" in said
            assert "binary" in said or "application/x-npy" in said
        status, _, answer = call(svc, "POST", V1, npy(sample(np.nan)), {"Content-Type": "application/x-npy"})
        assert status == 200 and np.isnan(np.load(io.BytesIO(answer))).all()


def test_the_runtime_refuses_non_finite_inputs_on_every_path(plain) -> None:  # type: ignore[no-untyped-def]
    """LoadedModel.run is what MQTT inference, the local API and probes share: the refusal lives there."""
    model = LoadedModel(*plain, 1)
    with pytest.raises(DataError, match="input 'input' holds NaN or Infinity"):
        model.run({"input": sample(np.inf)})
    assert model.run({"input": sample(1.0)})["logits"].shape == (1, 10)


def test_requests_holding_nan_never_move_drift_statistics(plain) -> None:  # type: ignore[no-untyped-def]
    bundle_dir, manifest = plain
    reference = load_reference(bundle_dir, manifest.drift_reference)
    assert reference is not None
    model = LoadedModel(bundle_dir, manifest.model_copy(update={"inputs": [manifest.inputs[0].model_copy(
        update={"non_finite": True})]}), 1)  # fmt: skip
    monitor = DriftMonitor(reference, DriftConfig(window=64, min_samples=16))
    try:
        rng = np.random.default_rng(0)
        clean = [rng.random((1, 1, 8, 8), dtype=np.float32) for _ in range(32)]
        for x in clean:
            monitor.observe({"input": x}, model.run({"input": x}))
        monitor.drain()
        before = monitor.scores()
        for value in (np.nan, np.inf) * 16:
            x = sample(value)
            monitor.observe({"input": x}, model.run({"input": x}))
        monitor.drain()
        assert monitor.non_finite == 32
        assert monitor.scores() == before
    finally:
        monitor.close()
