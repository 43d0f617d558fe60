"""Generation over MQTT (edgefleet/core/generation_messages.py): requests queued by the network thread, each run on
a generation worker of its own (never the inference thread, so a long answer neither blocks tensor requests nor
looks like a stuck agent), the answer streamed as numbered chunks on the client's response topic.

Bounded like the local API, by the same gate: at most `concurrency` generations run device-wide and `queue` wait;
a request beyond that is answered at once with an error chunk. Streamed text is joined into one chunk per
`mqtt_chunk_interval_s` (a token per MQTT message would cost more than the token). Every refusal answers the
caller with its reason and is counted; a bad request never stops a worker.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.call import GenerationCall, sampling, stops, text
from edgefleet.agent.api.generation.pacing import Coalescer
from edgefleet.agent.api.generation.runner import GenerationParts, GenerationRunner, Served
from edgefleet.agent.runtime.generative import GenerationResult
from edgefleet.core.errors import BrokerError
from edgefleet.core.generation_messages import GenerateChunk, GenerateRequest, GenerateUsage
from edgefleet.core.messages import MessageError, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)


class MqttGeneration:
    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        device_id: str,
        models: Callable[[], Mapping[str, Served]],
        parts: GenerationParts,
    ) -> None:
        self.conn, self.topics, self.device_id, self.parts = conn, topics, device_id, parts
        self._served = models
        self.runner = GenerationRunner(parts, self._models)
        self._requests: queue.Queue[GenerateRequest] = queue.Queue(maxsize=max(1, parts.config.capacity))
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"generation-mqtt-{i}", daemon=True)
            for i in range(parts.config.concurrency)
        ]

    def _models(self) -> Mapping[str, Served]:
        return {name: model for name, model in self._served().items() if model.manifest.generation is not None}

    def start(self) -> MqttGeneration:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    # --- the network thread: decode and enqueue only
    def on_request(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            request = decode(GenerateRequest, payload)
            self.topics.generate_response(self.device_id, request.client_id)  # a client id that can be a topic level
        except (MessageError, ValueError) as err:
            self.runner.accounting.refused("bad-request")
            log.warning("refused generation request on %s: %s", topic, err)
            return
        try:
            self._requests.put_nowait(request)
        except queue.Full:
            self._refuse(request, RequestError(503, "overloaded", "too many generations waiting: retry later"))

    # --- the generation workers
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                request = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._answer(request)
            except Exception:  # a worker outlives any bug in one request
                log.exception("generation request %s failed unanswered", request.request_id)

    def _answer(self, request: GenerateRequest) -> None:
        try:
            gate = self.parts.gate.enter()
        except RequestError as err:
            self._refuse(request, err)
            return
        try:
            self._generate(request, gate.wait)
        finally:
            gate.release()

    def _generate(self, request: GenerateRequest, wait: Callable[[], None]) -> None:
        publisher = _Publisher(self, request)
        try:
            call = self._call(request)
            prepared = self.runner.prepare(call)
            wait()
            result = self.runner.run(prepared, publisher.text if request.stream else _ignore)
        except RequestError as err:
            if err.kind != "runtime":
                self.runner.accounting.refused(err.kind)
            publisher.last(error=err.message)
            return
        error = f"generation cut: {result.cancelled_by}" if result.finish_reason == "cancelled" else None
        publisher.last(result, prepared.served.bundle_id, prepared.model.provider, error=error)

    def _call(self, request: GenerateRequest) -> GenerationCall:
        name = request.model
        if name is None:
            served = list(self._models())
            if not served:
                raise RequestError(404, "not-found", "no model is served here")
            name = served[0]
        messages = tuple((m.role, text(m.content, f"messages[{i}].content"))
                         for i, m in enumerate(request.messages or ()))  # fmt: skip
        if not messages and request.prompt is None:
            raise RequestError(400, "bad-request", "a generation request needs a prompt or messages")
        # the same checks as the HTTP endpoints (call.py): what the runtimes accept, never a model failure
        parameters = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
                      "seed": request.seed}  # fmt: skip
        prompt = text(request.prompt or "", "prompt")
        return GenerationCall(
            model=name, operation="chat" if messages else "text_completion", prompt=prompt,
            messages=messages, max_tokens=request.max_tokens, sampling=sampling(parameters),
            stop=stops(list(request.stop)), stream=request.stream, request_id=request.request_id,
        )  # fmt: skip

    def _refuse(self, request: GenerateRequest, err: RequestError) -> None:
        self.runner.accounting.refused(err.kind)
        _Publisher(self, request).last(error=err.message)

    def publish(self, request: GenerateRequest, chunk: GenerateChunk) -> None:
        topic = self.topics.generate_response(self.device_id, request.client_id)
        try:
            self.conn.publish(topic, chunk.encode(), qos=1)
        except (BrokerError, ValueError) as err:
            log.warning("cannot send chunk %d of generation %s: %s", chunk.index, request.request_id, err)


class _Publisher:
    """The chunks of one answer: the first piece at once, then text joined for at most the chunk interval
    (agent/api/generation/pacing.py), numbered, then the last chunk."""

    def __init__(self, owner: MqttGeneration, request: GenerateRequest) -> None:
        self.owner, self.request = owner, request
        self.index = 0
        self.pieces = Coalescer(owner.parts.config.mqtt_chunk_interval_s, self._text)

    def text(self, piece: str) -> None:
        self.pieces.text(piece)

    def last(
        self,
        result: GenerationResult | None = None,
        bundle_id: str | None = None,
        provider: str | None = None,
        *,
        error: str | None = None,
    ) -> None:
        text = self.pieces.take()
        if result is not None and not self.request.stream:
            text = result.text
        chunk = GenerateChunk(request_id=self.request.request_id, index=self.index, text=text,
                              done=True, error=error, bundle_id=bundle_id, provider=provider)  # fmt: skip
        if result is not None:
            usage = GenerateUsage(prompt_tokens=result.prompt_tokens, completion_tokens=len(result.tokens))
            chunk = chunk.model_copy(update={
                "finish_reason": result.finish_reason, "usage": usage, "ttft_ms": round(result.ttft_ms, 4),
                "tpot_ms": round(result.tpot_ms, 4) if result.tpot_ms is not None else None,
            })  # fmt: skip
        self._send(chunk)

    def _text(self, text: str) -> bool:
        self._send(GenerateChunk(request_id=self.request.request_id, index=self.index, text=text))
        return True

    def _send(self, chunk: GenerateChunk) -> None:
        self.owner.publish(self.request, chunk)
        self.index += 1


def _ignore(_text: str) -> None:
    return None


__all__ = ["MqttGeneration"]
