"""Inference over MQTT: requests queued by the network thread, answered one by one on the inference thread.

A device serves one model per slot: a request names its slot (`InferRequest.slot`, the slot's name or its model's
name); a request without one goes to the device's only slot, and with several slots it is refused with the list of
them (tests/integration/agent/test_slots.py).

A part the supervisor holds (agent/daemon/supervisor.py). A bad request or a runtime failure answers the caller;
it never stops the worker. String inputs (ONNX `tensor(string)`) travel as fixed-width unicode or UTF-8 bytes
arrays and are checked like the local API's BYTES tensors before the model sees them.
The local HTTP API is agent/api/service.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgefleet.agent.api.error_log import SampledLog
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.string_inputs import takes_text, text_from_array
from edgefleet.agent.quality import FeedbackError, Quality
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.schedule.gate import ComputeGate
from edgefleet.agent.telemetry import RequestStats
from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import BrokerError, DataError
from edgefleet.core.messages import InferRequest, InferResponse, MessageError, WireTensor, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 64 * 2**20  # the UTF-8 of one string input, at most (as the local API's default body limit)


def _feed(name: str, tensor: WireTensor, spec: TensorSpec | None) -> np.ndarray:
    """One input off the wire; a string input becomes the object array of checked text the runtimes take
    (agent/api/string_inputs.py: valid code points, UTF-8, per-element and total limits), else RequestError."""
    array = tensor.to_array()
    return text_from_array(name, array, MAX_TEXT_BYTES) if takes_text(spec) else array


@dataclass(frozen=True)
class InferenceTarget:
    """A slot as MQTT inference needs it: the model it serves now, its request statistics and quality record."""

    slot: str
    model: LoadedModel | None
    stats: RequestStats
    quality: Quality


class MqttInference:
    """Answers `infer/request` messages one at a time on its own thread (`run`), with the model the request's slot
    serves now (`route(slot)`, RequestError when there is no such slot or none was named among several); feedback
    messages go to the field-accuracy record. `stats` counts what is refused before a slot is known. `beat` is when
    its loop last turned (the supervisor's liveness check)."""

    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        device_id: str,
        route: Callable[[str | None], InferenceTarget],
        stats: RequestStats,
        feedback: Callable[[bytes], bool],
        queue_size: int = 256,
        compute: ComputeGate | None = None,
    ) -> None:
        self.conn, self.topics, self.device_id = conn, topics, device_id
        self.route, self.stats, self.feedback, self.compute = route, stats, feedback, compute
        self._requests: queue.Queue[bytes] = queue.Queue(maxsize=queue_size)
        self.beat = time.monotonic()
        self.errors = SampledLog(log)  # a flood of bad or failing requests is counted, never a line each

    def queue_depth(self) -> int:
        return self._requests.qsize()

    # --- the network thread: decode and enqueue only
    def on_request(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            self._requests.put_nowait(payload)
        except queue.Full:
            self.stats.record_error("mqtt:overloaded")
            self.errors.warning("overloaded", "inference queue full; request dropped")

    def on_feedback(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            self.feedback(payload)
        except (MessageError, FeedbackError) as err:
            self.errors.warning("bad-feedback", "refused feedback on %s: %s", topic, err)

    # --- the inference thread
    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.beat = time.monotonic()
            try:
                payload = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._answer(payload)
            except Exception:  # the worker must outlive any bug in one request
                self.errors.exception("unanswered", "inference request failed unanswered")

    def _answer(self, payload: bytes) -> None:
        try:
            request = decode(InferRequest, payload)
        except MessageError as err:
            self.stats.record_error("mqtt:bad-request")
            self.errors.warning("bad-request", "refused inference request: %s", err)
            return
        response = self._infer(request)
        try:
            self.conn.publish(self.topics.infer_response(self.device_id, request.client_id), response.encode(), qos=0)
        except (BrokerError, ValueError) as err:
            self.errors.warning("unanswerable", "cannot answer request %s: %s", request.request_id, err)

    def _infer(self, request: InferRequest) -> InferResponse:
        try:
            target = self.route(request.slot)
        except RequestError as err:
            self.stats.record_error("mqtt:no-model")
            return InferResponse(request_id=request.request_id, ok=False, error=err.message)
        model, stats = target.model, target.stats
        if model is None:
            stats.record_error("mqtt:no-model")
            return InferResponse(
                request_id=request.request_id, ok=False, error=f"no model installed in slot {target.slot!r}"
            )
        try:
            specs = {spec.name: spec for spec in model.manifest.inputs}
            feeds = {name: _feed(name, tensor, specs.get(name)) for name, tensor in request.inputs.items()}
            start = time.perf_counter()
            if self.compute is None:
                outputs = model.run(feeds)
            else:  # a step of the model's slot, ordered by its class (agent/schedule/gate.py)
                with self.compute.step(model.manifest.model_name):
                    outputs = model.run(feeds)
            latency = (time.perf_counter() - start) * 1000
        except (MessageError, DataError, RequestError) as err:  # the caller's input: never the model's failure
            stats.record_error("mqtt:bad-input")
            return InferResponse(request_id=request.request_id, ok=False, error=str(err), bundle_id=model.bundle_id)
        except Exception as err:  # a runtime failure answers the caller instead of killing the worker
            stats.record_failure()
            return InferResponse(
                request_id=request.request_id, ok=False, error=f"inference failed: {err}", bundle_id=model.bundle_id
            )
        stats.record(latency)
        target.quality.served_mqtt(model, request, feeds, outputs)
        return InferResponse(
            request_id=request.request_id,
            ok=True,
            latency_ms=round(latency, 4),
            provider=model.provider,
            bundle_id=model.bundle_id,
            outputs={k: WireTensor.of(v) for k, v in outputs.items()},
        )


__all__ = ["InferenceTarget", "MqttInference"]
