"""The Open Inference Protocol v2 on a real agent, called by Triton's and KServe's own clients, unchanged.

The model has two inputs and two outputs (built here with onnx.helper, converted and signed like any model);
every answer is compared with a direct ONNX Runtime run of the original file.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from edgefleet.core.trust.signing import SigningKey

from support.fleet import serve_model
from support.paths import REPO, TESTS
from support.servers.brokers import MosquittoBroker

DEVICE = "dev-oip"
MODEL = "two-io"
KSERVE_PYTHON = Path(os.environ.get("EDGEFLEET_KSERVE_PYTHON", REPO / ".venv-kserve" / "bin" / "python"))


def two_io_model(path: Path) -> Path:
    """scores = relu(concat(features, extra) @ W) and squared = features * features."""
    weights = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Concat", ["features", "extra"], ["joined"], axis=1),
        helper.make_node("MatMul", ["joined", "W"], ["product"]),
        helper.make_node("Relu", ["product"], ["scores"]),
        helper.make_node("Mul", ["features", "features"], ["squared"]),
    ]
    graph = helper.make_graph(
        nodes, "two_io",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("squared", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(weights, "W")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def samples(count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"features": rng.standard_normal((count, 1, 4)).astype(np.float32),
            "extra": rng.standard_normal((count, 1, 2)).astype(np.float32)}  # fmt: skip


@dataclass
class Agent:
    port: int
    bundle_id: str
    reference: ort.InferenceSession

    def expected(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.reference.get_outputs()]
        return dict(zip(names, self.reference.run(names, feeds), strict=True))


@pytest.fixture(scope="module")
def agent(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], signing_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Agent]:  # fmt: skip
    root = tmp_path_factory.mktemp("oip")
    model = two_io_model(root / "two_io.onnx")
    for name, seed in (("calib", 1), ("eval", 2)):
        np.savez(root / f"{name}.npz", **samples(32, seed))  # type: ignore[arg-type]
    with serve_model(mosquitto.url, keys[0].parent / "root.pub", signing_key, model, root, name=MODEL,
                     device=DEVICE) as served:  # fmt: skip
        yield Agent(served.port, served.bundle_id, ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]))


def test_tritonclient_reads_health_metadata_and_the_repository(agent: Agent) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{agent.port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert not client.is_model_ready("no-such-model")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    metadata = client.get_model_metadata(MODEL)
    assert metadata["name"] == MODEL and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [1, 4]},
                                  {"name": "extra", "datatype": "FP32", "shape": [1, 2]}]  # fmt: skip
    assert [o["name"] for o in metadata["outputs"]] == ["scores", "squared"]
    assert client.get_model_metadata(MODEL, model_version="1")["name"] == MODEL
    index = client.get_model_repository_index()
    assert index == [{"name": MODEL, "version": "1", "state": "READY", "reason": "", "slot": "default"}]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_infers_several_inputs_and_outputs_like_onnxruntime(agent: Agent, binary: bool) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{agent.port}")
    data = samples(8, seed=3)
    for index in range(8):
        feeds = {name: array[index] for name, array in data.items()}
        inputs = []
        for name, array in feeds.items():
            tensor = triton.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("scores", "squared")]
        result = client.infer(MODEL, inputs, outputs=outputs, request_id=f"req-{binary}-{index}")
        assert result.get_response()["id"] == f"req-{binary}-{index}"
        for name, expected in agent.expected(feeds).items():
            np.testing.assert_allclose(result.as_numpy(name), expected, rtol=1e-5, atol=1e-6)


def test_tritonclient_defaults_mixed_formats_and_one_requested_output(agent: Agent) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{agent.port}")
    feeds = {name: array[0] for name, array in samples(1, seed=4).items()}
    features = triton.InferInput("features", [1, 4], "FP32")
    features.set_data_from_numpy(feeds["features"])  # binary (the client's default)
    extra = triton.InferInput("extra", [1, 2], "FP32")
    extra.set_data_from_numpy(feeds["extra"], binary_data=False)  # JSON beside it
    expected = agent.expected(feeds)
    everything = client.infer(MODEL, [features, extra])  # no outputs named: all of them, binary
    for name in ("scores", "squared"):
        np.testing.assert_allclose(everything.as_numpy(name), expected[name], rtol=1e-5, atol=1e-6)
    only = client.infer(MODEL, [features, extra], outputs=[triton.InferRequestedOutput("squared")])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["squared"]
    np.testing.assert_allclose(only.as_numpy("squared"), expected["squared"], rtol=1e-6)


def test_tritonclient_gets_404_for_an_unknown_model_and_400_for_a_wrong_shape(agent: Agent) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{agent.port}")
    wrong = triton.InferInput("features", [1, 5], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 5), np.float32))
    extra = triton.InferInput("extra", [1, 2], "FP32")
    extra.set_data_from_numpy(np.zeros((1, 2), np.float32))
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("no-such-model", [wrong, extra])
    assert unknown.value.status() == "404" and "serving: two-io" in unknown.value.message()
    with pytest.raises(InferenceServerException) as shape:
        client.infer(MODEL, [wrong, extra])
    assert shape.value.status() == "400" and "dimension 1 is 5" in shape.value.message()
    with pytest.raises(InferenceServerException) as version:
        client.get_model_metadata(MODEL, model_version="7")
    assert version.value.status() == "404"
    with pytest.raises(InferenceServerException) as load:
        client.load_model(MODEL)
    assert load.value.status() == "403"


def test_feedback_quotes_the_oip_request_id(agent: Agent) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{agent.port}")
    feeds = {name: array[0] for name, array in samples(1, seed=5).items()}
    inputs = []
    for name, array in feeds.items():
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client.infer(MODEL, inputs, request_id="field-1")
    predicted = int(np.argmax(agent.expected(feeds)["scores"]))
    body = json.dumps({"id": "field-1", "label": predicted}).encode()
    url = f"http://127.0.0.1:{agent.port}/v2/models/{MODEL}/feedback"
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        scored = json.load(answer)
    assert scored["correct"] is True and scored["samples"] >= 1


def test_kserve_client_runs_unchanged_against_the_agent(agent: Agent, tmp_path: Path) -> None:
    assert KSERVE_PYTHON.exists(), (
        f"KServe's client needs its own environment: python3 -m venv .venv-kserve && "
        f".venv-kserve/bin/pip install kserve (scripts/test does it); looked for {KSERVE_PYTHON}"
    )
    feeds = {name: array[0] for name, array in samples(1, seed=6).items()}
    np.savez(tmp_path / "inputs.npz", **feeds)  # type: ignore[arg-type]
    script = TESTS / "support" / "clients" / "kserve_v2_client.py"
    run = subprocess.run(
        [str(KSERVE_PYTHON), str(script), f"http://127.0.0.1:{agent.port}", MODEL, str(tmp_path / "inputs.npz")],
        capture_output=True, text=True, timeout=180, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["live"] is True and report["ready"] is True and report["model_ready"] is True
    assert report["unknown_model_ready"] is False
    expected = agent.expected(feeds)
    for label in ("json", "binary"):
        answer = report[label]
        assert answer["id"] == f"kserve-{label == 'binary'}"
        for name, reference in expected.items():
            got = answer["outputs"][name]
            assert got["datatype"] == "FP32" and got["shape"] == list(reference.shape)
            np.testing.assert_allclose(np.array(got["data"], np.float32), reference, rtol=1e-5, atol=1e-6)
    assert report["unknown_model"]["status"] == 404 and "no model named" in report["unknown_model"]["message"]
    assert report["wrong_shape"]["status"] == 400 and "dimension 1 is 5" in report["wrong_shape"]["message"]
