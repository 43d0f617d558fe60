"""Quick requests: on an otherwise idle service, a request to a model whose last run took under a millisecond is
answered on the server's I/O thread (one thread wake-up fewer); anything else goes to a worker as before. The
answers, the counting and the limits are the same either way. Real ONNX Runtime sessions over real HTTP."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from edgefleet.agent.api.service import QUICK_MS, InferenceService, ServiceConfig
from edgefleet.agent.runtime.model import LoadedModel

from support.local_api import INFER, call, json_body, sample
from support.runtime import ModelWrapper

OIP = "/v2/models/digits-cnn/infer"


class RecordingModel(ModelWrapper):
    """A real model that notes which thread ran each call, optionally computing `extra_s` longer."""

    def __init__(self, inner: LoadedModel, extra_s: float = 0.0) -> None:
        super().__init__(inner)
        self.extra_s, self.threads = extra_s, []

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        end = time.perf_counter() + self.extra_s
        while time.perf_counter() < end:  # a slower model computes, it does not sleep
            pass
        return self.inner.run(feeds)


def _oip(x: np.ndarray, request_id: str) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return json.dumps({"id": request_id, "inputs": [tensor]}).encode()


def test_a_fast_model_on_an_idle_service_is_answered_on_the_io_thread_with_the_same_answer(
    models: dict[str, LoadedModel],
) -> None:
    recording = RecordingModel(models["v1"])
    x = sample(models)
    expected = models["v1"].run({"input": x})["logits"]
    latencies: list[float] = []
    with InferenceService([recording], ServiceConfig(port=0), on_answer=latencies.append) as svc:
        for _ in range(5):
            status, _, body = call(svc, "POST", INFER, json_body(x))
            assert status == 200
            np.testing.assert_allclose(json.loads(body)["outputs"]["logits"]["data"], expected.tolist(), rtol=1e-6)
            status, _, body = call(svc, "POST", OIP, _oip(x, "abc"))
            assert status == 200 and json.loads(body)["id"] == "abc"
        assert dict(svc.metrics.requests.items()) == {("digits-cnn", "200"): 10.0}
    assert recording.threads[0].startswith("inference-api-"), "its latency is unknown at first: a worker"
    for index in range(1, 10):  # the previous run decides (a run slowed by a loaded machine sends the next to a worker)
        quick = latencies[index - 1] < QUICK_MS
        assert (recording.threads[index] == "inference-api-io") == quick, (index, latencies, recording.threads)
    assert "inference-api-io" in recording.threads


def test_a_slow_model_is_always_answered_by_a_worker(models: dict[str, LoadedModel]) -> None:
    recording = RecordingModel(models["v1"], extra_s=2 * QUICK_MS / 1000)
    with InferenceService([recording], ServiceConfig(port=0)) as svc:
        for _ in range(4):
            assert call(svc, "POST", INFER, json_body(sample(models)))[0] == 200
    assert len(recording.threads) == 4 and "inference-api-io" not in recording.threads


def test_the_slot_a_quick_request_reserved_is_given_back_when_its_body_is_refused(
    models: dict[str, LoadedModel],
) -> None:
    config = ServiceConfig(port=0, concurrency=1, queue_size=0, queue_timeout_s=5)
    with InferenceService([models["v1"]], config) as svc:
        good = json_body(sample(models))
        assert call(svc, "POST", INFER, good)[0] == 200
        for _ in range(5):  # each is admitted quick (a slot reserved), then refused while decoding
            assert call(svc, "POST", INFER, b'{"inputs": 1}', {"Content-Type": "application/json"})[0] == 400
            assert call(svc, "POST", OIP, b'{"inputs": [{"name": "nope"}]}')[0] == 400
        for _ in range(3):
            assert call(svc, "POST", INFER, good)[0] == 200, "the one slot is free again"
        assert svc.metrics.queue_depth() == 0 and svc.metrics.in_flight() == 0
        assert svc._slots.acquire(blocking=False), "no reserved slot is left behind"
        svc._slots.release()


def _read_answer(reader) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    """One HTTP/1.1 answer off a raw socket's reader: (status, body)."""
    line = reader.readline()
    assert line.startswith(b"HTTP/1.1 "), line
    length = 0
    while (header := reader.readline()) != b"\r\n":
        if header.lower().startswith(b"content-length:"):
            length = int(header.split(b":")[1])
    return int(line.split()[1]), reader.read(length)


@pytest.mark.parametrize("extra_ms", [0.0, 2 * QUICK_MS], ids=["quick", "workers"])
def test_pipelined_requests_are_answered_in_order_without_recursion(
    models: dict[str, LoadedModel], extra_ms: float
) -> None:
    """300 requests in one write: answered once each, in order, whether the I/O thread answers them (quick) or the
    workers do (a model slower than QUICK_MS, as every model is on a loaded machine)."""
    count = 300
    x = sample(models)
    with InferenceService([RecordingModel(models["v1"], extra_s=extra_ms / 1000)], ServiceConfig(port=0)) as svc:
        assert call(svc, "POST", OIP, _oip(x, "warm"))[0] == 200  # the model's latency is known from here
        requests = []
        for index in range(count):
            body = _oip(x, f"r{index}")
            requests.append(f"POST {OIP} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        with socket.create_connection(("127.0.0.1", svc.port), timeout=30) as sock:
            # A pipelining client reads while it writes: the answers must never wait for the whole pipeline to be sent.
            sender = threading.Thread(target=sock.sendall, args=(b"".join(requests),), daemon=True)
            sender.start()
            reader = sock.makefile("rb")
            ids = []
            for _ in range(count):
                status, body = _read_answer(reader)
                assert status == 200
                ids.append(json.loads(body)["id"])
            sender.join(30)
        assert ids == [f"r{index}" for index in range(count)]


def test_quick_answers_and_worker_answers_mix_under_concurrent_clients(models: dict[str, LoadedModel]) -> None:
    x = sample(models)
    expected = models["v1"].run({"input": x})["logits"].tolist()
    answers: list[list[float]] = []
    with InferenceService([models["v1"]], ServiceConfig(port=0, concurrency=2)) as svc:

        def client() -> None:
            for _ in range(25):
                status, _, body = call(svc, "POST", OIP, _oip(x, "c"))
                assert status == 200
                answers.append(json.loads(body)["outputs"][0]["data"])

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert svc.metrics.queue_depth() == 0 and svc.metrics.in_flight() == 0
    assert len(answers) == 100
    for answer in answers:
        np.testing.assert_allclose(answer, np.ravel(expected), rtol=1e-6)


class BigAnswerModel(RecordingModel):
    """A fast model with a big answer: 1 Mi zeros (np.zeros costs nothing, so its run stays under QUICK_MS)."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        super().run(feeds)
        return {"logits": np.zeros((1, 1 << 20), dtype=np.float32)}


def test_a_quick_answer_the_peer_cannot_take_at_once_is_finished_by_a_worker_while_others_are_served(
    models: dict[str, LoadedModel],
) -> None:
    """A client that does not read (a 4 KiB receive buffer) asks for a multi-megabyte answer on the quick path: the
    I/O thread sends what the socket takes and hands the rest to a worker, so another client is answered meanwhile;
    the slow client gets the whole answer when it reads, and its connection stays open for the next request."""
    model = BigAnswerModel(models["v1"])
    x = sample(models)
    latencies: list[float] = []
    with InferenceService([model], ServiceConfig(port=0), on_answer=latencies.append) as svc:
        for _ in range(20):  # until the last run was quick (a loaded machine may slow one)
            assert call(svc, "POST", OIP, _oip(x, "warm"))[0] == 200
            if latencies[-1] < QUICK_MS:
                break
        assert latencies[-1] < QUICK_MS, latencies
        runs_before = len(model.threads)
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # set before connect: the window stays small
        slow.connect(("127.0.0.1", svc.port))
        with slow:
            body = _oip(x, "slow-1")
            slow.sendall(f"POST {OIP} HTTP/1.1\r\nHost: [::1]\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 10
            while len(model.threads) == runs_before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert model.threads[runs_before] == "inference-api-io", model.threads  # the quick path answered it
            time.sleep(0.3)  # the slow client still has not read a byte
            status, _, answer = call(svc, "POST", OIP, _oip(x, "other"))
            assert status == 200 and json.loads(answer)["id"] == "other", "the I/O thread never waits on a peer"
            slow.settimeout(30)
            reader = slow.makefile("rb")
            status, answer = _read_answer(reader)
            document = json.loads(answer)
            assert status == 200 and document["id"] == "slow-1"
            assert len(document["outputs"][0]["data"]) == 1 << 20
            body = _oip(x, "slow-2")
            slow.sendall(f"POST {OIP} HTTP/1.1\r\nHost: [::1]\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            status, answer = _read_answer(reader)
            assert status == 200 and json.loads(answer)["id"] == "slow-2"


def _post(sock: socket.socket, body: bytes) -> None:
    sock.sendall(f"POST {OIP} HTTP/1.1\r\nHost: [::1]\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


def test_requests_from_several_clients_at_once_go_to_the_workers_not_one_by_one_through_the_io_thread(
    models: dict[str, LoadedModel],
) -> None:
    """While the I/O thread answers a quick request, two other clients send theirs: they wait unread, and each
    alone would find the service idle. The server sees the other client's bytes and hands both to workers (so
    concurrent clients run in parallel, not one at a time on the I/O thread); a lone client is quick again later."""
    recording = RecordingModel(models["v1"])
    x = sample(models)
    latencies: list[float] = []
    on_io, release = threading.Event(), threading.Event()

    def answered(latency_ms: float) -> None:  # holds the I/O thread (not the model: its latency stays quick)
        latencies.append(latency_ms)
        if threading.current_thread().name == "inference-api-io" and not release.is_set():
            on_io.set()
            release.wait(10)

    with InferenceService([recording], ServiceConfig(port=0, concurrency=4), on_answer=answered) as svc:
        socks = [socket.create_connection(("127.0.0.1", svc.port), timeout=30) for _ in range(3)]
        readers = [s.makefile("rb") for s in socks]
        try:
            for attempt in range(50):  # until a request is answered on the I/O thread (a loaded machine slows some)
                _post(socks[0], _oip(x, f"warm-{attempt}"))
                if on_io.wait(0.5) or _read_answer(readers[0])[0] != 200:
                    break
            assert on_io.is_set(), latencies
            runs_before = len(recording.threads)
            _post(socks[1], _oip(x, "b"))
            _post(socks[2], _oip(x, "c"))
            release.set()  # both requests are in the server's socket buffers now, unread
            for index, request_id in ((1, "b"), (2, "c")):
                status, answer = _read_answer(readers[index])
                assert status == 200 and json.loads(answer)["id"] == request_id
            assert _read_answer(readers[0])[0] == 200
            both = recording.threads[runs_before:]
            assert len(both) == 2 and "inference-api-io" not in both, both
            time.sleep(0.2)  # past CROWD_S: a lone client, a fast model, an idle service
            for attempt in range(20):
                _post(socks[0], _oip(x, f"alone-{attempt}"))
                assert _read_answer(readers[0])[0] == 200
                if recording.threads[-1] == "inference-api-io":
                    break
            assert recording.threads[-1] == "inference-api-io", (latencies, recording.threads)
        finally:
            for reader, sock in zip(readers, socks, strict=True):
                reader.close()
                sock.close()
