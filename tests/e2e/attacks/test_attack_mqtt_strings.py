"""String inputs over MQTT inference, end to end: a scikit-learn pipeline with a categorical (string) input,
exported by skl2onnx, converted, deployed to a real agent on a real Mosquitto, asked over MQTT request/response.

The answers match ONNX Runtime on the skl2onnx file itself (non-ASCII, empty and unknown categories too). Hostile
string tensors (a huge item size, code points that are not text, a string over the per-element limit, bytes that
are not UTF-8, a shape the data does not fill, object arrays) each get an error reply that says why; none counts
as a model failure, and the daemon keeps serving.
"""

from __future__ import annotations

import base64
import json
import queue
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgefleet.agent.api.string_inputs import MAX_ELEMENT_BYTES
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.core.messages import InferResponse, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.attacks.ledger import AttackLedger
from support.fleet import FleetWatcher, serve_model
from support.models.string_input import colors_model, source_outputs
from support.servers.brokers import MosquittoBroker
from support.slots import slot_of

DEVICE, MODEL = "dev-mqtt-strings", "colors-mqtt"
TOPICS = Topics()


@dataclass
class Served:
    host: Connection
    bundle_id: str
    source: ort.InferenceSession
    watcher: FleetWatcher

    def expected(self, colors: list[str]) -> dict[str, np.ndarray]:
        return source_outputs(self.source, colors)


@pytest.fixture(scope="module")
def served(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], signing_key: SigningKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:  # fmt: skip
    root = tmp_path_factory.mktemp("mqtt-strings")
    model = colors_model(root, seed=1)
    with serve_model(mosquitto.url, keys[0].parent / "root.pub", signing_key, model, root, name=MODEL, device=DEVICE,
                     extra=("--telemetry-interval", "0.5")) as model_served:  # fmt: skip
        source = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        yield Served(model_served.host, model_served.bundle_id, source, model_served.watcher)


def _ask_raw(host: Connection, tensor: dict[str, object], timeout: float = 30.0) -> InferResponse:
    """Send one request whose string tensor is written by hand (what a hostile client can send)."""
    client_id, request_id = f"raw-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    box: queue.Queue[bytes] = queue.Queue()
    topic = TOPICS.infer_response(DEVICE, client_id)
    host.subscribe(topic, lambda _t, payload, _r: box.put(payload))
    try:
        body = {"request_id": request_id, "client_id": client_id, "inputs": {"color": tensor}}
        host.publish(TOPICS.infer_request(DEVICE), json.dumps(body).encode(), qos=1, wait=10)
        response = decode(InferResponse, box.get(timeout=timeout))
    finally:
        host.unsubscribe(topic)
    assert response.request_id == request_id
    return response


def _raw(dtype: str, shape: list[int], data: bytes) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data": base64.b64encode(data).decode()}


def _utf32(*codes: int) -> bytes:
    return np.array(codes, dtype="<u4").tobytes()


def test_string_inputs_over_mqtt_answer_like_onnxruntime(served: Served) -> None:
    remote = RemoteModel(served.host, TOPICS, DEVICE)
    batches = [["red"], ["green", "grün", "blue"], ["yellow", "purple", "", "red"]]  # unknown and empty too
    answers = remote.infer_many([{"color": np.array(c, dtype=object).reshape(-1, 1)} for c in batches])
    for colors, answer in zip(batches, answers, strict=True):
        assert answer.ok, answer.error
        assert answer.bundle_id == served.bundle_id
        expected = served.expected(colors)
        np.testing.assert_array_equal(answer.outputs["label"].to_array().ravel(), expected["label"].ravel())
        # whichever recipe the converter picked (FP32 or an INT8 one that passed its gate): within 0.02
        np.testing.assert_allclose(answer.outputs["probabilities"].to_array(), expected["probabilities"], atol=0.02)
    # numpy's fixed-width unicode and UTF-8 bytes arrays are string tensors too
    (unicode_answer, bytes_answer) = remote.infer_many(
        [{"color": np.array([["grün"], ["red"]])}, {"color": np.array([["grün".encode()], [b"red"]])}]
    )
    for answer in (unicode_answer, bytes_answer):
        assert answer.ok, answer.error
        np.testing.assert_array_equal(
            answer.outputs["label"].to_array().ravel(), served.expected(["grün", "red"])["label"].ravel()
        )


HOSTILE = {
    "an item size of four billion characters": (_raw("<U1000000000", [1, 1], _utf32(0x72)), "cannot be decoded"),
    "a zero-width string dtype": (_raw("<U0", [1, 1], b""), "cannot be decoded"),
    "a code point beyond Unicode": (_raw("<U1", [1, 1], _utf32(0x110000)), "not text"),
    "a lone surrogate": (_raw("<U2", [1, 1], _utf32(0x61, 0xD800)), "not text"),
    "a string over the per-element limit": (
        _raw(f"<U{MAX_ELEMENT_BYTES + 1}", [1, 1], _utf32(*([0x61] * (MAX_ELEMENT_BYTES + 1)))),
        "per string",
    ),
    "bytes that are not UTF-8": (_raw("|S2", [1, 1], b"\xff\xfe"), "not UTF-8"),
    "a shape the data does not fill": (_raw("<U3", [4, 1], _utf32(*[0x72, 0x65, 0x64] * 2)), "cannot be decoded"),
    "a shape of the wrong rank": (_raw("<U3", [1], _utf32(0x72, 0x65, 0x64)), "rank"),
    "an object array (a pickle)": (_raw("|O", [1, 1], b"\x80\x04N."), "object arrays are not accepted"),
    "numbers where strings belong": (_raw("<f4", [1, 1], b"\x00\x00\x80\x3f"), "the model wants"),
}


def test_hostile_string_tensors_get_an_error_reply_and_the_daemon_keeps_serving(
    served: Served, attack_ledger: AttackLedger
) -> None:
    remote = RemoteModel(served.host, TOPICS, DEVICE)
    before = len(served.watcher.telemetry)
    earlier = [t for t in served.watcher.telemetry if t.device_id == DEVICE]
    refused_before = earlier[-1].errors_by_kind.get("mqtt:bad-input", 0) if earlier else 0
    for name, (tensor, reason) in HOSTILE.items():
        answer = _ask_raw(served.host, tensor)
        (good,) = remote.infer_many([{"color": np.array([["red"]], dtype=object)}])
        harmed = answer.ok or not good.ok
        assert not attack_ledger.record(
            f"MQTT inference with {name} in a string input",
            harmed,
            f"error reply: {(answer.error or '')[:90]}; the next request ok: {good.ok}",
        )
        assert reason in (answer.error or ""), (name, answer.error)

    # None of it counts against the model: every telemetry window from the first request to one that closed after
    # the last reports 0 model failures (MQTT refusals are the caller's: errors_by_kind, never `errors`).
    answered_at = time.time()
    watcher = served.watcher

    def windows() -> list[Telemetry] | None:
        reports = [t for t in watcher.telemetry[before:] if t.device_id == DEVICE]
        return reports if reports and reports[-1].ts > answered_at else None

    reports = watcher.wait_for("a telemetry window after the last request", windows, 30)
    assert sum(t.requests for t in reports) >= len(HOSTILE)  # the good requests between the hostile ones
    assert sum(t.errors for t in reports) == 0, [(t.errors, t.requests) for t in reports]
    # They are counted where an operator looks: telemetry's refusals by kind.
    assert reports[-1].errors_by_kind.get("mqtt:bad-input") == refused_before + len(HOSTILE), reports[-1]
    status = watcher.status[DEVICE]
    assert status.online and slot_of(status).active_bundle == served.bundle_id and status.state == "serving"
