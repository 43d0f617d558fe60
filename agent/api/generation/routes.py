"""The local API's generation endpoints: Triton's generate and generate_stream (agent/api/generation/triton_api.py) and
OpenAI's completions and chat (agent/api/generation/openai_api.py), whole or streamed as server-sent events (the
first piece at once, then pieces joined for at most `stream_interval_s`: agent/api/generation/pacing.py).

From the head alone: a body over the generation cap is a 413, before the body is read; for Triton, an unknown or
non-generative model a 404/400. Once the body is complete (within `body_timeout_s`, 10 s), a place at the gate is
taken, or refused with a 503 and Retry-After when every gate place runs and every queue place is taken: a client that
trickles its body holds a socket, never a place. Then, on a worker: the body parsed, the model resolved, the prompt
tokenized and its budget set (400 when the prompt alone fills the context), a gate place waited for (503 after the queue
timeout), and only then the answer begins, so every refusal has its status code even for a stream. A stream holds
its worker and its gate place until it ends; a client that goes away stops its generation at the next token (counted
as cut). Every refusal is counted (`GenerationStats.refused`, `edgefleet_generations_refused_total{reason}`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgefleet.agent.api.answers import Answers
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation import openai_api, sse, triton_api
from edgefleet.agent.api.generation.call import GenerationCall
from edgefleet.agent.api.generation.gate import GatePass
from edgefleet.agent.api.generation.pacing import Coalescer, Send
from edgefleet.agent.api.generation.runner import GenerationRunner, Prepared
from edgefleet.agent.api.http.protocol import Admission, Head, Response, Write
from edgefleet.agent.api.place import Place
from edgefleet.agent.runtime.generative import GenerationResult

log = logging.getLogger(__name__)

Parse = Callable[[bytes], GenerationCall]


class GenerationRoutes:
    def __init__(self, runner: GenerationRunner, answers: Answers) -> None:
        self.runner, self.answers = runner, answers

    # --- Triton's generate extension
    def triton(self, head: Head, name: str, version: str | None, length: int, *, stream: bool) -> Response | Admission:
        try:
            served, _ = self.runner.resolve(name)
            if version is not None and version != served.manifest.model_version:
                raise RequestError(404, "not-found", f"model {name!r} has no version {version!r} here")
            self._fits(length)
        except RequestError as err:
            return self._refuse(err, name, oip=True)
        model_version = served.manifest.model_version
        place = self._place(lambda err: self._refuse(err, name, oip=True))

        def handle(body: bytes) -> Response:
            gate = place.held
            try:
                call = triton_api.parse(body, name)
                prepared = self._ready(call, gate)
            except RequestError as err:
                return self._refuse(err, name, oip=True)
            if stream:
                return self._stream(prepared, gate, self._triton_events(prepared, model_version))
            try:
                result = self.runner.run(prepared, _ignore)
            except RequestError as err:
                return self._refuse(err, name, oip=True)
            finally:
                gate.release()
            if result.finish_reason == "cancelled":
                return self._refuse(_cut(result), name, oip=True)
            return self.answers.json(triton_api.answer(call, model_version, result), name)

        return place.admission(handle, body_timeout_s=self.runner.parts.config.body_timeout_s)

    def _triton_events(self, prepared: Prepared, version: str) -> Callable[[Write], None]:
        call = prepared.call

        def events(write: Write) -> None:
            pieces = self._coalescer(lambda text: write(sse.event(triton_api.piece(call, version, text))))

            def on_text(text: str) -> None:
                if not pieces.text(text):
                    prepared.stopper.stop("cancelled", "the client went away")

            try:
                result = self.runner.run(prepared, on_text)
            except RequestError as err:
                write(sse.event(triton_api.error(err.message)))
                return
            pieces.flush()
            if result.finish_reason == "cancelled":
                write(sse.event(triton_api.error(_cut(result).message)))
            else:
                write(sse.event(triton_api.last(call, version, result)))

        return events

    # --- OpenAI's completions and chat
    def openai(self, head: Head, path: str, length: int) -> Response | Admission:
        parse: Parse = openai_api.parse_chat if path == openai_api.CHAT else openai_api.parse_completion
        try:
            self._fits(length)
        except RequestError as err:
            return self._refuse(err, "-", openai_shape=True)
        place = self._place(lambda err: self._refuse(err, "-", openai_shape=True))

        def handle(body: bytes) -> Response:
            gate, name = place.held, "-"
            try:
                call = parse(body)
                name = call.model if call.model in self.runner.served() else "-"  # counted by a served name only
                prepared = self._ready(call, gate)
            except RequestError as err:
                return self._refuse(err, name, openai_shape=True)
            answer = openai_api.Answer(call)
            if call.stream:
                return self._stream(prepared, gate, self._openai_events(prepared, answer))
            try:
                result = self.runner.run(prepared, _ignore)
            except RequestError as err:
                return self._refuse(err, name, openai_shape=True)
            finally:
                gate.release()
            if result.finish_reason == "cancelled":
                return self._refuse(_cut(result), name, openai_shape=True)
            return self.answers.json(answer.whole(result), name)

        return place.admission(handle, body_timeout_s=self.runner.parts.config.body_timeout_s)

    def _openai_events(self, prepared: Prepared, answer: openai_api.Answer) -> Callable[[Write], None]:
        call = prepared.call

        def events(write: Write) -> None:
            pieces = self._coalescer(lambda text: write(sse.event(answer.chunk(text))))

            def on_text(text: str) -> None:
                if not pieces.text(text):
                    prepared.stopper.stop("cancelled", "the client went away")

            if answer.chat:
                write(sse.event(answer.chunk("", role=True)))
            try:
                result: GenerationResult = self.runner.run(prepared, on_text)
            except RequestError as err:
                write(sse.event(openai_api.error_document(err)))
                return
            pieces.flush()
            if result.finish_reason == "cancelled":
                write(sse.event(openai_api.error_document(_cut(result))))
                return
            write(sse.event(answer.chunk(None if answer.chat else "", result.finish_reason)))
            if call.include_usage:
                write(sse.event(answer.usage_chunk(result)))
            write(sse.DONE)

        return events

    # --- shared
    def _coalescer(self, send: Send) -> Coalescer:
        return Coalescer(self.runner.parts.config.stream_interval_s, send)

    def _fits(self, length: int) -> None:
        limit = self.runner.parts.config.max_body_bytes
        if length > limit:
            raise RequestError(413, "too-large", f"a generation request is at most {limit} bytes, not {length}")

    def _place(self, refuse: Callable[[RequestError], Response]) -> Place[GatePass]:
        """A place among the admitted generations, taken once the body is complete (503 when the gate is full)."""
        return Place(self.runner.parts.gate.enter, refuse)

    def _ready(self, call: GenerationCall, gate: GatePass) -> Prepared:
        """Prepared and holding a generation place: every refusal comes before the answer begins."""
        prepared = self.runner.prepare(call)
        gate.wait()
        return prepared

    def _stream(self, prepared: Prepared, gate: GatePass, events: Callable[[Write], None]) -> Response:
        gate.hold()  # the stream releases the generation place when it ends (the handler's release leaves it)

        def stream(write: Write) -> None:
            try:
                events(write)
            finally:
                gate.release(final=True)

        self.answers.count(prepared.name, 200)
        headers = {"X-Bundle-Id": prepared.served.bundle_id, "X-Provider": prepared.model.provider}
        return Response(200, content_type=sse.CONTENT_TYPE, headers=headers, stream=stream)

    def _refuse(self, err: RequestError, name: str, *, oip: bool = False, openai_shape: bool = False) -> Response:
        if err.kind not in ("runtime", "cut"):  # a cut is counted as one by the accounting
            self.runner.accounting.refused(err.kind)
        if openai_shape:
            return openai_api.error_response(self.answers, err, name)
        return self.answers.error(err, name, oip=oip)


def _cut(result: GenerationResult) -> RequestError:
    return RequestError(503, "cut", f"generation cut after {len(result.tokens)} tokens: {result.cancelled_by}")


def _ignore(_text: str) -> None:
    return None


__all__ = ["GenerationRoutes"]
