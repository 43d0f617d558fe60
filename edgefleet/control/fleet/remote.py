"""Remote inference on a device over MQTT request/response (what the demo sends the eval set through)."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterable

import numpy as np

from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import InferFeedback, InferRequest, InferResponse, MessageError, WireTensor, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics


class RemoteModel:
    """One model of a device, called over MQTT: `slot` names the model on a device serving several (None: the
    device's only one; a device serving several refuses a request that names none, with the slots it serves)."""

    def __init__(self, conn: Connection, topics: Topics, device_id: str, slot: str | None = None) -> None:
        self.conn, self.topics, self.device_id, self.slot = conn, topics, device_id, slot
        self.client_id = f"c{uuid.uuid4().hex[:12]}"
        self._pending: dict[str, queue.Queue[InferResponse]] = {}
        self._lock = threading.Lock()
        self._topic = topics.infer_response(device_id, self.client_id)
        conn.subscribe(self._topic, self._on_response, qos=0)

    def close(self) -> None:
        self.conn.unsubscribe(self._topic)

    def _on_response(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            response = decode(InferResponse, payload)
        except MessageError:
            return
        with self._lock:
            box = self._pending.get(response.request_id)
        if box is not None:
            box.put(response)

    def infer_many(
        self, samples: Iterable[dict[str, np.ndarray]], *, window: int = 8, timeout: float = 30.0
    ) -> list[InferResponse]:
        """Send samples with up to `window` requests in flight; answers come back in input order."""
        boxes: list[tuple[str, queue.Queue[InferResponse]]] = []
        results: list[InferResponse] = []
        for feeds in samples:
            request_id = uuid.uuid4().hex
            box: queue.Queue[InferResponse] = queue.Queue(maxsize=1)
            with self._lock:
                self._pending[request_id] = box
            request = InferRequest(
                request_id=request_id,
                client_id=self.client_id,
                slot=self.slot,
                inputs={k: WireTensor.of(v) for k, v in feeds.items()},
            )
            self.conn.publish(self.topics.infer_request(self.device_id), request.encode(), qos=0)
            boxes.append((request_id, box))
            if len(boxes) >= window:
                results.append(self._collect(*boxes.pop(0), timeout))
        results.extend(self._collect(rid, box, timeout) for rid, box in boxes)
        return results

    def feedback(self, request_id: str, labels: list[int], *, timeout: float = 10.0) -> None:
        """Tell the device the true class of each sample of an earlier request (its field accuracy)."""
        message = InferFeedback(request_id=request_id, client_id=self.client_id, labels=labels)
        self.conn.publish(self.topics.infer_feedback(self.device_id), message.encode(), qos=1, wait=timeout)

    def _collect(self, request_id: str, box: queue.Queue[InferResponse], timeout: float) -> InferResponse:
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise BrokerError(f"device {self.device_id} did not answer request {request_id} in {timeout:g} s") from None
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
