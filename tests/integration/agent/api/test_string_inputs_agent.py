"""A scikit-learn pipeline with a string (categorical) input, exported by skl2onnx, converted end to end and served
by a real agent: OIP v2 takes the strings as BYTES, in JSON and in the binary extension (each element a 4-byte
little-endian length and its bytes), from Triton's own client; /v1 takes them as JSON dtype "str". Every answer is
compared with ONNX Runtime on the skl2onnx file itself. A malformed string tensor is a 400 with its reason, and
never counts against the model.

The device's golden check reports the bundle's task rule and its score in telemetry; the control plane's ingestor
stores it, and `edgefleet devices show` and the dashboard's quality view show it."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from edgefleet.control.dashboard.quality import api_quality
from edgefleet.control.fleet.ingest import Ingestor
from edgefleet.control.store import open_store
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.fleet import FleetWatcher, serve_model
from support.models.string_input import colors_model, source_outputs
from support.paths import REPO
from support.servers.brokers import MosquittoBroker

DEVICE, MODEL = "dev-strings", "colors"
INFER = f"/v2/models/{MODEL}/infer"


@dataclass
class Served:
    port: int
    bundle_id: str
    source: ort.InferenceSession  # the skl2onnx file itself
    watcher: FleetWatcher
    store_url: str  # the control plane's store, fed by a real ingestor

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def expected(self, colors: list[str]) -> dict[str, np.ndarray]:
        return source_outputs(self.source, colors)


@pytest.fixture(scope="module")
def served(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], signing_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:  # fmt: skip
    root = tmp_path_factory.mktemp("strings")
    model = colors_model(root, seed=0)
    store_url = f"sqlite:///{root / 'plane.sqlite'}"
    ingest_conn = Connection(mosquitto.url, f"strings-ingest-{root.name}", protocol="auto").start()
    ingestor = Ingestor(ingest_conn, Topics(), open_store(store_url), share_group=None).start()
    try:
        with serve_model(mosquitto.url, keys[0].parent / "root.pub", signing_key, model, root, name=MODEL,
                         device=DEVICE) as served:  # fmt: skip
            source = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
            yield Served(served.port, served.bundle_id, source, served.watcher, store_url)
    finally:
        ingestor.stop()
        ingestor.store.close()
        ingest_conn.stop()


def _assert_like_source(served: Served, colors: list[str], label: np.ndarray, probabilities: np.ndarray) -> None:
    expected = served.expected(colors)
    np.testing.assert_array_equal(np.asarray(label).ravel(), expected["label"].ravel())
    # whichever recipe the converter picked (FP32 or an INT8 one that passed its gate): within 0.02
    np.testing.assert_allclose(np.asarray(probabilities), expected["probabilities"], atol=0.02)


def test_model_metadata_declares_the_string_input_as_bytes(served: Served) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    metadata = client.get_model_metadata(MODEL)
    assert metadata["inputs"] == [{"name": "color", "datatype": "BYTES", "shape": [-1, 1]}]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_sends_string_inputs_as_bytes_and_gets_what_onnxruntime_gives(
    served: Served, binary: bool
) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    for colors in (["red"], ["green", "grün", "blue"], ["yellow", "purple", "", "red"]):  # unknown and empty too
        tensor = triton.InferInput("color", [len(colors), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(colors, dtype=object).reshape(-1, 1), binary_data=binary)
        requested = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "probabilities")]
        result = client.infer(MODEL, [tensor], outputs=requested)
        _assert_like_source(served, colors, result.as_numpy("label"), result.as_numpy("probabilities"))


def test_v1_takes_string_inputs_as_json_str(served: Served) -> None:
    colors = ["blue", "grün"]
    body = json.dumps({"inputs": {"color": {"dtype": "str", "shape": [2, 1], "data": colors}}}).encode()
    request = urllib.request.Request(
        served.url(f"/v1/models/{MODEL}/infer"), body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        outputs = json.load(answer)["outputs"]
    _assert_like_source(served, colors, outputs["label"]["data"], outputs["probabilities"]["data"])


def test_v1_takes_string_inputs_as_unicode_arrays_in_npz(served: Served) -> None:
    colors = ["yellow", "red", "grün"]
    buffer = io.BytesIO()
    np.savez(buffer, color=np.array(colors).reshape(-1, 1))  # unicode, no pickles
    request = urllib.request.Request(served.url(f"/v1/models/{MODEL}/infer"), buffer.getvalue(),
                                     {"Content-Type": "application/x-npz", "Accept": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        outputs = json.load(answer)["outputs"]
    _assert_like_source(served, colors, outputs["label"]["data"], outputs["probabilities"]["data"])


def _binary_request(served: Served, shape: list[int], blob: bytes, datatype: str = "BYTES") -> tuple[int, str]:
    header = json.dumps({"inputs": [{"name": "color", "shape": shape, "datatype": datatype,
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()  # fmt: skip
    return _post(served, header + blob, {"Inference-Header-Content-Length": str(len(header))})


def _json_request(served: Served, shape: list[int], data: object, datatype: str = "BYTES") -> tuple[int, str]:
    body = json.dumps({"inputs": [{"name": "color", "shape": shape, "datatype": datatype, "data": data}]})
    return _post(served, body.encode(), {})


def _post(served: Served, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(served.url(INFER), body, {"Content-Type": "application/octet-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]


def _element(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


def _runtime_failures(served: Served) -> float:
    with urllib.request.urlopen(served.url("/metrics"), timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith('edgefleet_errors_total{kind="runtime"}')
    )


@pytest.mark.parametrize(
    ("case", "send", "status", "reason"),
    [
        ("fewer strings than the shape", lambda s: _binary_request(s, [3, 1], _element(b"red") * 2), 400,
         "the data ends before element 2 of 3"),
        ("a count the bytes cannot hold", lambda s: _binary_request(s, [1000, 1], _element(b"red")), 400,
         "7 bytes cannot hold 1000 length-prefixed strings"),
        ("more strings than the shape", lambda s: _binary_request(s, [1, 1], _element(b"red") * 2), 400,
         "bytes are left after its 1 strings"),
        ("a length past the end", lambda s: _binary_request(s, [1, 1], struct.pack("<I", 99) + b"red"), 400,
         "element 0 declares 99 bytes; only 3 are left"),
        ("a string over the cap", lambda s: _binary_request(s, [1, 1], _element(b"r" * 70_000)), 400,
         "element 0 is 70000 bytes; the limit is 65536 per string"),
        ("bytes that are not UTF-8", lambda s: _binary_request(s, [1, 1], _element(b"\xff\xfe")), 400,
         "element 0 is not UTF-8 text"),
        ("JSON count off the shape", lambda s: _json_request(s, [2, 1], ["red"]), 400,
         "data holds 1 strings, shape [2, 1] needs 2"),
        ("JSON numbers as strings", lambda s: _json_request(s, [1, 1], [7]), 400,
         "BYTES data holds a int; every element must be a string"),
        ("floats for a string input", lambda s: _json_request(s, [1, 1], [1.0], "FP32"), 400,
         "input 'color' is BYTES in this model; the request sends FP32"),
        ("a wrong rank", lambda s: _json_request(s, [1], ["red"]), 400, "has rank 1"),
    ],
    ids=lambda value: value.replace(" ", "-") if isinstance(value, str) and " " in value else "",
)  # fmt: skip
def test_a_malformed_string_tensor_is_a_400_with_its_reason_and_never_a_model_failure(
    served: Served, case: str, send: object, status: int, reason: str
) -> None:
    assert callable(send)
    got, message = send(served)
    assert got == status and reason in message, (case, got, message)
    assert _runtime_failures(served) == 0
    good, answer = _json_request(served, [1, 1], ["red"])  # the model still answers
    assert good == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == served.expected(["red"])["label"].ravel().tolist()


def test_tritonclient_sees_the_refusal_as_a_400(served: Served) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    tensor = triton.InferInput("color", [2, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 1), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [tensor])
    assert refused.value.status() == "400" and "is BYTES in this model" in refused.value.message()


def test_the_golden_checks_task_rule_and_score_reach_telemetry_the_store_the_cli_and_the_dashboard(
    served: Served,
) -> None:
    installed = served.watcher.event(DEVICE, "installed", bundle_id=served.bundle_id)
    report = served.watcher.wait_for(
        "a telemetry report with the golden task score",
        lambda: next((t for t in served.watcher.telemetry if t.device_id == DEVICE and t.golden_task), None),
        timeout=60,
    )
    task = report.golden_task
    assert task is not None and task.computable and task.passed
    assert task.score is not None and task.floor is not None and task.score >= task.floor
    # the same rule and score the golden check named in its reason, as numbers now
    assert f"task rule {task.metric} {task.score:.4g} meets its floor {task.floor:.4g}" in installed.detail

    def stored() -> object:
        store = open_store(served.store_url)
        try:
            return next((q.golden_task for q in reversed(store.quality(DEVICE, 0.0)) if q.golden_task), None)
        finally:
            store.close()

    assert served.watcher.wait_for("the ingestor to store the task score", stored, timeout=60) == task
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shown = subprocess.run(
        [sys.executable, "-m", "edgefleet", "devices", "show", DEVICE, "--store", served.store_url, "--json"],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["golden_task"] == task.model_dump(mode="json")
    table = subprocess.run(
        [sys.executable, "-m", "edgefleet", "devices", "show", DEVICE, "--store", served.store_url],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    assert f"{task.metric} {task.score:.4g} meets floor {task.floor:.4g}" in table.stdout, table.stdout
    store = open_store(served.store_url)
    try:
        (device,) = [d for d in api_quality(store)["devices"] if d["device_id"] == DEVICE]
    finally:
        store.close()
    (bundle,) = [b for b in device["bundles"] if b["bundle"] == served.bundle_id]
    assert bundle["golden_task"] == task.model_dump(mode="json")
