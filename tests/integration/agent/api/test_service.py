"""The local inference API end to end over real HTTP (TCP and a Unix socket), on real ONNX Runtime sessions."""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgefleet.agent.api.service import InferenceService, ServiceConfig
from edgefleet.agent.runtime.model import LoadedModel

from support.local_api import (
    INFER,
    GatedModel,
    call,
    json_body,
    npy,
    raw_exchange,
    sample,
)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


@pytest.fixture
def service(models: dict[str, LoadedModel]) -> Iterator[InferenceService]:
    config = ServiceConfig(port=0, max_body_bytes=64 * 1024, concurrency=2, queue_size=8)
    with InferenceService([models["v1"], models["dyn"]], config) as svc:
        yield svc


def test_json_npz_and_npy_requests_get_the_models_answer(
    service: InferenceService, models: dict[str, LoadedModel]
) -> None:
    x = sample(models)
    expected = models["v1"].run({"input": x})["logits"]
    status, headers, body = call(service, "POST", INFER, json_body(x), {"Content-Type": "application/json"})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["bundle_id"] == models["v1"].bundle_id and answer["provider"] == "CPUExecutionProvider"
    assert headers["x-provider"] == "CPUExecutionProvider" and headers["x-bundle-id"] == models["v1"].bundle_id
    np.testing.assert_allclose(np.array(answer["outputs"]["logits"]["data"], np.float32), expected, atol=1e-6)

    buffer = io.BytesIO()
    np.savez(buffer, input=x)
    status, headers, body = call(service, "POST", INFER, buffer.getvalue(), {"Content-Type": "application/x-npz"})
    assert status == 200 and headers["content-type"] == "application/x-npz"
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["logits"], expected)

    status, headers, body = call(service, "POST", INFER, npy(x), {"Content-Type": "application/x-npy"})
    assert status == 200 and headers["content-type"] == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(body), allow_pickle=False), expected)

    status, _, body = call(
        service, "POST", INFER, npy(x), {"Content-Type": "application/x-npy", "Accept": "application/json"}
    )
    assert status == 200 and json.loads(body)["outputs"]["logits"]["shape"] == [1, 10]


def test_symbolic_dimensions_accept_any_batch(service: InferenceService) -> None:
    x = np.zeros((3, 1, 8, 8), np.float32)
    status, _, body = call(service, "POST", "/v1/models/digits-dyn/infer", json_body(x))
    assert status == 200 and json.loads(body)["outputs"]["logits"]["shape"] == [3, 10]
    status, _, body = call(service, "POST", "/v1/models/digits-dyn/infer", json_body(np.zeros((3, 1, 8, 7), "f4")))
    assert status == 400 and "dimension 3 is 7" in json.loads(body)["error"]["message"]


def test_each_class_of_bad_input_is_a_clear_client_error(
    service: InferenceService, models: dict[str, LoadedModel]
) -> None:
    x = sample(models)
    pickled = npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases: list[tuple[str, bytes, str, int, str]] = [
        ("wrong input name", json_body(x, name="pixels"), "application/json", 400, "unexpected ['pixels']"),
        ("wrong dtype", json_body(x.astype(np.float64)), "application/json", 400, "dtype float64"),
        ("wrong rank", json_body(x[0]), "application/json", 400, "has rank 3"),
        ("wrong dimension", json_body(np.zeros((1, 1, 8, 9), "f4")), "application/json", 400, "dimension 3 is 9"),
        ("data and shape disagree", json_body(x, shape=[1, 1, 8, 9]), "application/json", 400, "holds 64 values"),
        ("not a dtype", json_body(x, dtype="float128x"), "application/json", 400, "unknown dtype"),
        ("object dtype", json_body(x, dtype="object"), "application/json", 400, "not a numeric or bool dtype"),
        ("not JSON", b"{inputs:", "application/json", 400, "not valid JSON"),
        ("no inputs key", b'{"x": 1}', "application/json", 400, '{"inputs"'),
        ("a pickled .npy", pickled, "application/x-npy", 400, "pickles"),
        ("a broken .npz", b"PK not a zip", "application/x-npz", 400, "not a readable .npz"),
        ("another content type", b"x", "text/plain", 415, "not accepted"),
    ]
    for case, body, content_type, status, fragment in cases:
        got, _, answer = call(service, "POST", INFER, body, {"Content-Type": content_type})
        assert got == status, (case, answer)
        error = json.loads(answer)["error"]
        assert error["kind"] == "bad-request" and fragment in error["message"], (case, error)
    status, _, answer = call(service, "POST", "/v1/models/nope/infer", json_body(x))
    assert status == 404 and "serving: digits-cnn, digits-dyn" in json.loads(answer)["error"]["message"]
    assert call(service, "GET", INFER)[0] == 405
    assert call(service, "GET", "/nowhere")[0] == 404


def test_a_body_over_the_limit_gets_413_without_being_read(service: InferenceService) -> None:
    head = f"POST {INFER} HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n"
    answer, closed = raw_exchange(service.port, head.encode())
    assert answer.startswith(b"HTTP/1.1 413 ") and b"exceeds the limit of 65536 bytes" in answer and closed
    no_length = f"POST {INFER} HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n"
    assert raw_exchange(service.port, no_length.encode())[0].startswith(b"HTTP/1.1 411 ")
    assert raw_exchange(service.port, b"GARBAGE\r\n\r\n")[0].startswith(b"HTTP/1.1 400 ")


def test_a_flood_beyond_the_queue_gets_503_and_the_admitted_requests_finish(models: dict[str, LoadedModel]) -> None:
    gated = GatedModel(models["v1"])
    config = ServiceConfig(port=0, concurrency=1, queue_size=2)
    body = json_body(sample(models))
    with InferenceService([gated], config) as svc:
        admitted: list[int] = []
        threads = [threading.Thread(target=lambda: admitted.append(call(svc, "POST", INFER, body)[0])) for _ in "abc"]
        for thread in threads:
            thread.start()
        assert gated.entered.acquire(timeout=10)  # one runs (blocked in the model), two wait for the slot
        deadline = time.monotonic() + 10
        while svc.metrics.queue_depth() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert svc.metrics.queue_depth() == 2
        flood = [call(svc, "POST", INFER, body) for _ in range(20)]
        assert [status for status, _, _ in flood] == [503] * 20
        assert flood[0][1]["retry-after"] == "1" and json.loads(flood[0][2])["error"]["kind"] == "overloaded"
        gated.gate.set()
        for thread in threads:
            thread.join(10)
        assert admitted == [200, 200, 200]
        assert dict(svc.metrics.errors.items())[("overloaded",)] == 20


def test_hot_swap_under_concurrent_load_drops_no_request(models: dict[str, LoadedModel]) -> None:
    v1, v2 = models["v1"], models["v2"]
    body = json_body(sample(models))
    with InferenceService([v1], ServiceConfig(port=0, concurrency=2, queue_size=64)) as svc:
        stop = threading.Event()
        results: list[tuple[int, str]] = []

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)  # keep-alive
            while not stop.is_set():
                conn.request("POST", INFER, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                payload = response.read()
                bundle = json.loads(payload).get("bundle_id", "") if response.status == 200 else payload.decode()
                results.append((response.status, bundle))
            conn.close()

        clients = [threading.Thread(target=client) for _ in range(4)]
        for thread in clients:
            thread.start()
        for index in range(20):
            time.sleep(0.03)
            svc.swap(v2 if index % 2 == 0 else v1)
        stop.set()
        for thread in clients:
            thread.join(10)
    failed = [r for r in results if r[0] != 200]
    assert len(results) > 100 and not failed, failed[:3]
    assert {bundle for _, bundle in results} == {v1.bundle_id, v2.bundle_id}


def test_in_flight_requests_finish_on_the_old_model(models: dict[str, LoadedModel]) -> None:
    old = GatedModel(models["v1"])
    body = json_body(sample(models))
    with InferenceService([old], ServiceConfig(port=0)) as svc:
        answers: list[dict[str, Any]] = []
        thread = threading.Thread(target=lambda: answers.append(json.loads(call(svc, "POST", INFER, body)[2])))
        thread.start()
        assert old.entered.acquire(timeout=10)
        assert svc.swap(models["v2"]) is old
        assert not svc.wait_idle(old, timeout_s=0.05)
        status, _, answer = call(svc, "POST", INFER, body)
        assert status == 200 and json.loads(answer)["bundle_id"] == models["v2"].bundle_id
        old.gate.set()
        thread.join(10)
        assert answers[0]["bundle_id"] == models["v1"].bundle_id
        assert svc.wait_idle(old, timeout_s=5)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict reader of the text format: every line is a HELP, a TYPE or a well-formed sample."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            types[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert family in types or name in types, f"sample {name} has no TYPE line"
        parsed = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        samples.setdefault(name, []).append((parsed, float(value)))
    return samples


def test_metrics_parse_and_count_what_happened(service: InferenceService, models: dict[str, LoadedModel]) -> None:
    body = json_body(sample(models))
    for _ in range(5):
        assert call(service, "POST", INFER, body)[0] == 200
    assert call(service, "POST", INFER, b"{", {"Content-Type": "application/json"})[0] == 400
    status, headers, text = call(service, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = parse_prometheus(text.decode())
    buckets = [s for s in samples["edgefleet_inference_latency_seconds_bucket"] if s[0]["model"] == "digits-cnn"]
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and buckets[-1][0]["le"] == "+Inf" and counts[-1] == 5
    assert buckets[0][0]["provider"] == "CPUExecutionProvider"
    errors = {labels["kind"]: value for labels, value in samples["edgefleet_errors_total"]}
    assert errors["bad-request"] == 1 and errors["overloaded"] == 0
    requests = {(labels["model"], labels["code"]): value for labels, value in samples["edgefleet_requests_total"]}
    assert requests[("digits-cnn", "200")] == 5 and requests[("digits-cnn", "400")] == 1
    assert samples["edgefleet_queue_depth"] == [({}, 0.0)]
    p50, _, p99 = service.metrics.snapshot("digits-cnn").percentiles()
    assert p50 is not None and p99 is not None and 0 < p50 <= p99 < 1000


def test_models_and_health_endpoints(service: InferenceService, models: dict[str, LoadedModel]) -> None:
    status, _, body = call(service, "GET", "/v1/models")
    listed = {m["name"]: m for m in json.loads(body)["models"]}
    assert status == 200 and set(listed) == {"digits-cnn", "digits-dyn"}
    v1 = listed["digits-cnn"]
    assert v1["bundle_id"] == models["v1"].bundle_id and v1["provider"] == "CPUExecutionProvider"
    assert v1["inputs"] == [{"name": "input", "dtype": "float32", "shape": [1, 1, 8, 8]}]
    assert listed["digits-dyn"]["inputs"][0]["shape"] == ["N", 1, 8, 8]
    status, _, body = call(service, "GET", "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "models": ["digits-cnn", "digits-dyn"]}


def test_the_api_serves_on_a_unix_socket(models: dict[str, LoadedModel], tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with InferenceService([models["v1"]], ServiceConfig(unix_socket=path)) as svc:
        assert svc.address == f"unix:{path}" and oct(path.stat().st_mode & 0o777) == "0o660"
        conn = UnixHTTPConnection(str(path))
        conn.request("POST", INFER, npy(sample(models)), {"Content-Type": "application/x-npy"})
        response = conn.getresponse()
        assert response.status == 200 and np.load(io.BytesIO(response.read())).shape == (1, 10)
        conn.close()
    assert not path.exists()


def test_the_api_refuses_to_bind_beyond_loopback(models: dict[str, LoadedModel]) -> None:
    with pytest.raises(ValueError, match="loopback"):
        InferenceService([models["v1"]], ServiceConfig(host="0.0.0.0"))
