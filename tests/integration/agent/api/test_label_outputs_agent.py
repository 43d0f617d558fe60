"""A scikit-learn classifier with string classes, exported by skl2onnx with its default ZipMap, converted end to end
and served by a real agent: the golden check compares the string labels exactly (class agreement, not floats), the
local API answers them on /v1 (JSON strings, .npz unicode) and on the Open Inference Protocol v2 (BYTES, JSON and
binary, read by Triton's own client), with the class labels of the ZipMap's probability columns."""

from __future__ import annotations

import io
import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from edgefleet.core.trust.signing import SigningKey

from support.fleet import FleetWatcher, serve_model
from support.servers.brokers import MosquittoBroker
from support.slots import slot_of

DEVICE, MODEL = "dev-labels", "iris-names"
NAMES = ["setosa", "versicolor", "virginica"]


@dataclass
class Served:
    port: int
    bundle_id: str
    source: ort.InferenceSession  # the skl2onnx file itself, ZipMap and all
    x: np.ndarray
    watcher: FleetWatcher

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def served(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], signing_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:  # fmt: skip
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    root = tmp_path_factory.mktemp("labels")
    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    estimator = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)).fit(x, np.array(NAMES)[y])
    model = root / "iris.onnx"
    model.write_bytes(to_onnx(estimator, x[:1]).SerializeToString())
    np.savez(root / "calib.npz", X=x[:, None, :])
    np.savez(root / "eval.npz", X=x[:, None, :])
    with serve_model(mosquitto.url, keys[0].parent / "root.pub", signing_key, model, root, name=MODEL, device=DEVICE,
                     extra=("--threads", "0")) as served:  # fmt: skip
        source = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        yield Served(served.port, served.bundle_id, source, x, served.watcher)


def _source_labels(served: Served, rows: np.ndarray) -> list[str]:
    return [str(v) for v in served.source.run(["output_label"], {"X": rows})[0]]


def test_the_golden_check_on_the_device_compares_the_string_labels_exactly_under_the_bundles_task_rule(
    served: Served,
) -> None:
    installed = served.watcher.event(DEVICE, "installed", bundle_id=served.bundle_id)
    assert "output_label class-agreement 1" in installed.detail, installed.detail
    # The converter chose the recipe by argmax agreement with a drop of 0.01 at most: the device judges by it too.
    assert re.search(r"judged by task rule argmax-agreement [\d.]+ meets its floor 0\.99", installed.detail), (
        installed.detail
    )
    with urllib.request.urlopen(served.url(f"/v1/models/{MODEL}"), timeout=30) as answer:
        golden = json.load(answer)["golden"]
    assert golden["passed"] and golden["rule"] == "task rule argmax-agreement"
    report = served.watcher.wait_for(
        "golden scores", lambda: next((t for t in served.watcher.telemetry if t.golden_scores), None), timeout=60
    )
    label = next(s for s in report.golden_scores if s.output == "output_label")
    assert label.rule == "class-agreement" and label.passed and label.score == 1.0


def test_v1_answers_the_string_labels_and_the_probability_columns_classes(served: Served) -> None:
    rows = served.x[[0, 60, 120]]
    body = json.dumps({"inputs": {"X": {"dtype": "float32", "shape": [3, 4], "data": rows.tolist()}}}).encode()
    infer = served.url(f"/v1/models/{MODEL}/infer")
    request = urllib.request.Request(infer, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        document = json.load(answer)
    label = document["outputs"]["output_label"]
    assert label["dtype"] == "str" and label["data"] == _source_labels(served, rows)
    assert document["class_labels"] == {"output_probability": NAMES}
    assert np.array(document["outputs"]["output_probability"]["data"]).shape == (3, 3)
    npz = urllib.request.Request(infer, body,
                                 {"Content-Type": "application/json", "Accept": "application/x-npz"})  # fmt: skip
    with urllib.request.urlopen(npz, timeout=30) as answer, np.load(io.BytesIO(answer.read())) as arrays:
        assert arrays["output_label"].dtype.kind == "U"  # no pickles: unicode, not objects
        assert arrays["output_label"].tolist() == _source_labels(served, rows)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_oip_v2_serves_the_labels_as_bytes_to_tritons_client(served: Served, binary: bool) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    metadata = client.get_model_metadata(MODEL)
    outputs = {o["name"]: o for o in metadata["outputs"]}
    assert outputs["output_label"]["datatype"] == "BYTES"
    assert outputs["output_probability"]["parameters"] == {"class_labels": NAMES}
    rows = served.x[[10, 70, 140, 100]]
    tensor = triton.InferInput("X", [4, 4], "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    requested = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("output_label", "output_probability")]
    result = client.infer(MODEL, [tensor], outputs=requested)
    labels = result.as_numpy("output_label")
    assert [v.decode() if isinstance(v, bytes) else str(v) for v in labels.ravel()] == _source_labels(served, rows)
    answered = {o["name"]: o for o in result.get_response()["outputs"]}
    assert answered["output_label"]["datatype"] == "BYTES"
    assert answered["output_probability"]["parameters"]["class_labels"] == NAMES
    want = served.source.run(["output_probability"], {"X": rows})[0]  # ZipMap: a list of {class: probability}
    got = result.as_numpy("output_probability")
    for row, mapping in zip(got, want, strict=True):
        np.testing.assert_allclose(row, [mapping[n] for n in NAMES], atol=0.05)  # an INT8 build is allowed too


def test_an_agent_left_to_choose_its_threads_reports_the_measured_choice_in_its_status(served: Served) -> None:
    status = served.watcher.serving(DEVICE, served.bundle_id)
    summary = slot_of(status).provider_summary or ""
    assert "the runtime's default threads" in summary and "2 threads" in summary, summary  # the profile's count


def test_string_labels_travel_over_mqtt_inference_as_unicode_tensors() -> None:
    from edgefleet.core.messages import WireTensor

    labels = np.array(["setosa", "virginica"], dtype=object)  # as ONNX Runtime returns them
    wire = WireTensor.model_validate_json(WireTensor.of(labels).model_dump_json())
    assert wire.dtype.startswith("<U") and wire.to_array().tolist() == ["setosa", "virginica"]
