"""Inference over MQTT: requests queued by the network thread, answered one by one on the inference thread.

A mixin of `Agent` (agent/daemon.py). A bad request or a runtime failure answers the caller; it never stops
the worker. String inputs (ONNX `tensor(string)`) travel as fixed-width unicode or UTF-8 bytes arrays and are
checked like the local API's BYTES tensors before the model sees them. The local HTTP/gRPC API is agent/service.py.
"""

from __future__ import annotations

import logging
import queue
import time

import numpy as np

from edgefleet.agent.api_errors import RequestError
from edgefleet.agent.bytes_inputs import takes_text, text_from_array
from edgefleet.agent.reporting import Reporter
from edgefleet.core.errors import BrokerError, DataError
from edgefleet.core.manifest import TensorSpec
from edgefleet.core.messages import InferRequest, InferResponse, MessageError, WireTensor, decode

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 64 * 2**20  # the UTF-8 of one string input, at most (as the local API's default body limit)


def _feed(name: str, tensor: WireTensor, spec: TensorSpec | None) -> np.ndarray:
    """One input off the wire; a string input becomes the object array of checked text the runtimes take
    (agent/bytes_inputs.py: valid code points, UTF-8, per-element and total limits), else RequestError."""
    array = tensor.to_array()
    return text_from_array(name, array, MAX_TEXT_BYTES) if takes_text(spec) else array


class MqttInference(Reporter):
    _inference_beat: float

    def _on_infer_request(self, topic: str, payload: bytes, retained: bool) -> None:
        """Network thread: enqueue only."""
        try:
            self._requests.put_nowait(payload)
        except queue.Full:
            self.stats.record_error("mqtt:overloaded")
            log.warning("inference queue full; request dropped")

    def _inference_loop(self) -> None:
        while not self._stop.is_set():
            self._inference_beat = time.monotonic()
            try:
                payload = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._answer(payload)
            except Exception:  # the worker must outlive any bug in one request
                log.exception("inference request failed unanswered")

    def _answer(self, payload: bytes) -> None:
        try:
            request = decode(InferRequest, payload)
        except MessageError as err:
            self.stats.record_error("mqtt:bad-request")
            log.warning("refused inference request: %s", err)
            return
        response = self._infer(request)
        try:
            self.conn.publish(
                self.topics.infer_response(self.config.device_id, request.client_id), response.encode(), qos=0
            )
        except (BrokerError, ValueError) as err:
            log.warning("cannot answer request %s: %s", request.request_id, err)

    def _infer(self, request: InferRequest) -> InferResponse:
        model = self.model
        if model is None:
            self.stats.record_error("mqtt:no-model")
            return InferResponse(request_id=request.request_id, ok=False, error="no model installed")
        try:
            specs = {spec.name: spec for spec in model.manifest.inputs}
            feeds = {name: _feed(name, tensor, specs.get(name)) for name, tensor in request.inputs.items()}
            start = time.perf_counter()
            outputs = model.run(feeds)
            latency = (time.perf_counter() - start) * 1000
        except (MessageError, DataError, RequestError) as err:  # the caller's input: never the model's failure
            self.stats.record_error("mqtt:bad-input")
            return InferResponse(request_id=request.request_id, ok=False, error=str(err), bundle_id=model.bundle_id)
        except Exception as err:  # a runtime failure answers the caller instead of killing the worker
            self.stats.record_failure()
            return InferResponse(
                request_id=request.request_id, ok=False, error=f"inference failed: {err}", bundle_id=model.bundle_id
            )
        self.stats.record(latency)
        self.quality.served_mqtt(model, request, feeds, outputs)
        return InferResponse(
            request_id=request.request_id,
            ok=True,
            latency_ms=round(latency, 4),
            provider=model.provider,
            bundle_id=model.bundle_id,
            outputs={k: WireTensor.of(v) for k, v in outputs.items()},
        )
