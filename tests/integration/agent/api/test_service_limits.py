"""The local inference API's limits, on real ONNX Runtime sessions over real HTTP: what counts against the model,
refusals from the head before the body, a place taken only once the body is complete, deadlines, connections that
cost no thread, pipelining, OIP errors."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import numpy as np
import pytest

from edgefleet.agent.api.service import InferenceService, ServiceConfig
from edgefleet.agent.runtime.model import LoadedModel

from support.local_api import INFER, GatedModel, call, json_body, npy, raw_exchange, sample


class FailingModel(GatedModel):
    """A real model's manifest whose run raises: the one kind of failure that is the model's own."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise RuntimeError("the accelerator fell over")


def test_only_a_failure_of_the_models_own_run_counts_against_it(models: dict[str, LoadedModel]) -> None:
    failures: list[int] = []
    answered: list[float] = []
    config = ServiceConfig(port=0)
    x = sample(models)
    bad_bodies: list[tuple[bytes, str]] = [
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json"),
        (json_body(x, shape=[2**62, 2**62]), "application/json"),
        (b"PK\x03\x04" + b"\0" * 64, "application/x-npz"),
        (npy(x)[:-8], "application/x-npy"),
        (json_body(x.astype(np.float64)), "application/json"),
    ]
    with InferenceService([models["v1"]], config, on_answer=answered.append,
                          on_failure=lambda: failures.append(1)) as svc:  # fmt: skip
        for body, content_type in bad_bodies:
            status, _, answer = call(svc, "POST", INFER, body, {"Content-Type": content_type})
            assert status == 400, answer
        assert call(svc, "POST", INFER, json_body(x))[0] == 200
        assert failures == [] and len(answered) == 1
        svc.swap(FailingModel(models["v1"]))
        status, _, answer = call(svc, "POST", INFER, json_body(x))
        assert status == 500 and json.loads(answer)["error"]["kind"] == "runtime"
        assert failures == [1]
        assert dict(svc.metrics.failures.items()) == {("digits-cnn",): 1.0}
        assert dict(svc.metrics.errors.items())[("bad-request",)] == len(bad_bodies)


def test_a_request_is_refused_from_its_head_before_its_body_is_read(models: dict[str, LoadedModel]) -> None:
    with InferenceService([models["v1"]], ServiceConfig(port=0, max_body_bytes=1 << 20)) as svc:
        for path, length, status in (("/v2/models/nope/infer", 4000, b"404"), (INFER, 4_000_000, b"413")):
            head = f"POST {path} HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"
            with socket.create_connection(("127.0.0.1", svc.port), timeout=10) as sock:
                sock.sendall(f"{head}Content-Length: {length}\r\n\r\n".encode())  # not one byte of the body follows
                assert sock.recv(65536).startswith(b"HTTP/1.1 " + status + b" ")


def test_a_queue_place_is_taken_only_once_the_body_is_complete(models: dict[str, LoadedModel]) -> None:
    """A client that trickles its body holds a socket, never a place: with the one slot busy and no queue, a
    request whose body is still arriving is not refused for a full queue, and holds nothing until it is whole."""
    gated = GatedModel(models["v1"])
    body = json_body(sample(models))
    with InferenceService([gated], ServiceConfig(port=0, concurrency=1, queue_size=0)) as svc:
        head = f"POST {INFER} HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"
        slow = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
        slow.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])  # the rest comes later
        answers: list[int] = []
        busy = threading.Thread(target=lambda: answers.append(call(svc, "POST", INFER, body)[0]))
        busy.start()
        assert gated.entered.acquire(timeout=10)  # admitted and running: the trickling client held no place
        slow.sendall(body[10:])  # complete: a place is asked for now, and there is none
        answer = slow.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"queue full" in answer
        slow.close()
        gated.gate.set()
        busy.join(10)
        assert answers == [200] and svc.metrics.queue_depth() == 0 and svc.metrics.in_flight() == 0


def test_a_body_that_never_arrives_times_out_and_frees_its_place(models: dict[str, LoadedModel]) -> None:
    config = ServiceConfig(port=0, concurrency=1, queue_size=0, body_timeout_s=0.5)
    with InferenceService([models["v1"]], config) as svc:
        head = f"POST {INFER} HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        with socket.create_connection(("127.0.0.1", svc.port), timeout=10) as sock:
            sock.sendall(head.encode() + b'{"inp')
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert svc.metrics.queue_depth() == 0 and call(svc, "POST", INFER, json_body(sample(models)))[0] == 200


def test_connections_cost_no_thread_each_and_pipelined_requests_are_answered_in_order(
    models: dict[str, LoadedModel],
) -> None:
    with InferenceService([models["v1"]], ServiceConfig(port=0, workers=3)) as svc:
        call(svc, "GET", "/healthz")
        threads = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", svc.port), timeout=10) for _ in range(200)]
        try:
            deadline = time.monotonic() + 10
            while svc.metrics.open_connections() < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert svc.metrics.open_connections() == 200 and threading.active_count() == threads
            body = json_body(sample(models))
            one = f"POST {INFER} HTTP/1.1\r\nHost: [::1]\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            last = b"GET /healthz HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n"
            answer, _ = raw_exchange(svc.port, one + one + last)
            assert answer.count(b"HTTP/1.1 200 ") == 3 and answer.rstrip().endswith(b'"models": ["digits-cnn"]}')
        finally:
            for sock in idle:
                sock.close()


def test_telemetry_counts_only_the_models_failures_as_errors() -> None:
    from edgefleet.agent.telemetry.stats import RequestStats

    stats = RequestStats()
    stats.record(0.1)
    for _ in range(30):
        stats.record_error("mqtt:bad-request")  # refused over MQTT: malformed, or the queue was full
    stats.record_error("mqtt:overloaded")
    stats.record_failure()
    _, requests, errors, _ = stats.snapshot()
    assert (requests, errors) == (1, 1)
    assert stats.failure_ratio(20) == (0.5, 2)
    assert stats.refused_by_kind() == {"mqtt:bad-request": 30, "mqtt:overloaded": 1}  # telemetry's errors_by_kind


def test_oip_errors_are_counted_by_kind_and_the_metrics_page_negotiates_openmetrics(
    models: dict[str, LoadedModel],
) -> None:
    config = ServiceConfig(port=0, max_body_bytes=4096)
    x = sample(models)
    good = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": x.ravel().tolist()}]}
    with InferenceService([models["v1"]], config) as svc:
        v2 = "/v2/models/digits-cnn/infer"
        assert call(svc, "POST", v2, json.dumps(good).encode())[0] == 200
        wrong = {"inputs": [{**good["inputs"][0], "shape": [1, 1, 8, 9]}]}
        status, headers, body = call(svc, "POST", v2, json.dumps(wrong).encode())
        assert status == 400 and headers["x-error-kind"] == "bad-request" and "dimension 3" in json.loads(body)["error"]
        assert call(svc, "POST", "/v2/models/nope/infer", json.dumps(good).encode())[0] == 404
        assert call(svc, "POST", v2, b"x" * 5000)[0] == 413
        assert call(svc, "GET", "/v2/models/digits-cnn/versions/9")[0] == 404
        counted = dict(svc.metrics.errors.items())
        assert counted == {("bad-request",): 1, ("not-found",): 2, ("too-large",): 1}
        assert dict(svc.metrics.failures.items()) == {}
        status, headers, page = call(svc, "GET", "/metrics", headers={"Accept": "application/openmetrics-text"})
        assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert page.decode().endswith("# EOF\n") and "edgefleet_requests_created" in page.decode()


def test_a_large_answer_to_a_slow_reader_arrives_whole_and_the_connection_is_reused(
    models: dict[str, LoadedModel],
) -> None:
    x = np.random.default_rng(0).random((20_000, 1, 8, 8), dtype=np.float32)
    body = npy(x)
    request = (
        f"POST /v1/models/digits-dyn/infer HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/x-npy\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    expected = models["dyn"].run({"input": x})["logits"]
    with (
        InferenceService([models["dyn"]], ServiceConfig(port=0, max_body_bytes=16 * 2**20)) as svc,
        socket.create_connection(("127.0.0.1", svc.port), timeout=30) as sock,
    ):
        reader = sock.makefile("rb")
        for _ in range(2):  # the same keep-alive connection twice
            sock.sendall(request)
            time.sleep(0.5)  # the answer (megabytes of JSON) fills the socket buffers meanwhile
            assert reader.readline().startswith(b"HTTP/1.1 200 ")
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answer = json.loads(reader.read(length))
            assert length > 2**20
            got = np.array(answer["outputs"]["logits"]["data"], np.float32)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_at_the_connection_limit_the_longest_idle_connection_makes_room(models: dict[str, LoadedModel]) -> None:
    with InferenceService([models["v1"]], ServiceConfig(port=0, max_connections=8)) as svc:
        held = []
        for _ in range(12):
            held.append(socket.create_connection(("127.0.0.1", svc.port), timeout=10))
            held[-1].sendall(b"GET /heal")  # half a head, never finished
        try:
            assert call(svc, "POST", INFER, json_body(sample(models)))[0] == 200
            with contextlib.suppress(ConnectionResetError):  # the oldest was closed for a newcomer: FIN or reset
                assert held[0].recv(1) == b""
            assert svc.metrics.open_connections() <= 8
            assert dict(svc.metrics.closed.items())[("evicted",)] >= 5
        finally:
            for sock in held:
                sock.close()


def test_with_a_token_every_endpoint_needs_it_and_the_api_may_listen_beyond_loopback(
    models: dict[str, LoadedModel],
) -> None:
    token = "0123456789abcdef-token"
    with pytest.raises(ValueError, match="beyond loopback"):
        InferenceService([models["v1"]], ServiceConfig(host="0.0.0.0", port=0))
    with InferenceService([models["v1"]], ServiceConfig(host="0.0.0.0", port=0, api_token=token)) as svc:
        body = json_body(sample(models))
        oip = "/v2/models/digits-cnn/infer"
        for method, path, payload in (("GET", "/metrics", None), ("GET", "/v2/health/ready", None),
                                      ("POST", INFER, body), ("POST", oip, b"{}")):  # fmt: skip
            status, headers, _ = call(svc, method, path, payload)
            assert status == 401 and headers["www-authenticate"] == "Bearer", path
        assert call(svc, "POST", INFER, body, {"Authorization": "Bearer wrong"})[0] == 401
        assert call(svc, "POST", INFER, body, {"Authorization": f"Bearer {token}"})[0] == 200
