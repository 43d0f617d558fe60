"""Which request goes where, decided from the head alone (agent/api/http/server.py's `App`), and the /v1 API.

Every answer is counted (agent/api/answers.py): requests by (model, code), and every answer but 200 by kind. A body that
cannot be decoded, whatever the exception, is a 400 (a MemoryError a 413): it never reaches the model and
never counts as a model failure.

    /v2/...                        the Open Inference Protocol (agent/api/oip_routes.py), the primary API
    POST /v1/models/{name}/infer   JSON {"inputs": {input: {"dtype", "shape", "data"}}}, a .npz body
                                   (application/x-npz) or a .npy body (application/x-npy, single input);
                                   the answer has the request's format unless `Accept` asks for another
    POST /v1/models/{name}/feedback  {"request_id": ..., "label": N}
    GET  /v1/models, /v1/models/{name}, /healthz, /metrics (Prometheus text, or OpenMetrics on request)
    POST /v1/completions, /v1/chat/completions   OpenAI-compatible generation (agent/api/generation/)

`GET /v1/models` and `GET /v1/models/{name}` are both edgefleet's and OpenAI's: the list holds OpenAI's `object`
and `data` beside edgefleet's `models`, and a model's description carries OpenAI's `id`, `object`, `created` and
`owned_by` beside edgefleet's fields, so clients of either read the same answer.
"""

from __future__ import annotations

import json
import re
import time

from edgefleet.agent.api.answers import SMALL_BODY_S, Answers
from edgefleet.agent.api.body_guard import decode_guarded
from edgefleet.agent.api.callers import Callers
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation import openai_api
from edgefleet.agent.api.generation.routes import GenerationRoutes
from edgefleet.agent.api.generation.runner import GenerationParts, GenerationRunner
from edgefleet.agent.api.http.protocol import Admission, Head, Response
from edgefleet.agent.api.oip_routes import RoutesV2
from edgefleet.agent.api.place import Place
from edgefleet.agent.api.served import Admitted, Serving
from edgefleet.agent.api.wire import JSON, answer_format, decode_body, encode_outputs, tensor_json

_NAME = r"([A-Za-z0-9._-]{1,64})"
_V1_INFER = re.compile(rf"^/v1/models/{_NAME}/infer$")
_V1_MODEL = re.compile(rf"^/v1/models/{_NAME}$")
_V1_FEEDBACK = re.compile(rf"^/v1/models/{_NAME}/feedback$")


class Routes:
    def __init__(
        self, service: Serving, generation: GenerationParts | None = None, callers: Callers | None = None
    ) -> None:
        """`callers`: who may call (agent/api/callers.py); None checks nothing (a test of the routes alone)."""
        self.service, self.callers = service, callers
        self.answers = Answers(service.metrics)
        parts = generation or GenerationParts.standalone()
        self.generation = GenerationRoutes(GenerationRunner(parts, service.models), self.answers)
        self.v2 = RoutesV2(service, self.answers, self.generation)
        self.started = int(time.time())  # OpenAI's `created` of the models served

    # --- the App interface
    def admit(self, head: Head, length: int) -> Response | Admission:
        if self.callers is not None:
            try:
                self.callers.check(head)
            except RequestError as err:  # answered before routing: in the shape of the API the path belongs to
                response = self.answers.error(err, oip=head.path.startswith("/v2"))
                if err.status == 401:
                    response.headers["WWW-Authenticate"] = "Bearer"
                return response
        if head.path.startswith("/v2"):
            return self.v2.admit(head, length)
        try:
            return self._admit_v1(head, length)
        except RequestError as err:
            model = m.group(1) if (m := _V1_INFER.match(head.path) or _V1_FEEDBACK.match(head.path)) else "-"
            return self.answers.error(err, model)

    def refused(self, status: int, message: str) -> Response:
        return self.answers.refused(status, message)

    # --- /v1 and the shared endpoints
    def _admit_v1(self, head: Head, length: int) -> Response | Admission:
        service, answers, path = self.service, self.answers, head.path
        if path in (openai_api.COMPLETIONS, openai_api.CHAT):
            if head.method != "POST":
                return answers.error(RequestError(405, "bad-request", f"use POST for {path}"), allow="POST")
            return self.generation.openai(head, path, length)
        if head.method == "POST":
            if match := _V1_INFER.match(path):
                name = match.group(1)
                self._served(name)  # 404 from the head; the queue place is taken once the body is complete
                place: Place[Admitted] = Place(lambda: service.admit(name), lambda err: answers.error(err, name))
                return place.admission(lambda body: self._infer_v1(place.held, head, body), lambda: place.held.quick(),
                                       service.config.body_timeout_s)  # fmt: skip
            if match := _V1_FEEDBACK.match(path):
                name = match.group(1)
                return Admission(lambda body: answers.feedback(service, name, body), body_timeout_s=SMALL_BODY_S)
            raise RequestError(404, "not-found", f"no such endpoint {path} (POST /v2/models/NAME/infer)")
        if head.method != "GET":
            error = RequestError(405, "bad-request", f"method {head.method} not allowed")
            return answers.error(error, allow="GET, POST")
        if path == "/metrics":
            accept = head.headers.get("accept", "")
            return answers.later(lambda: self._metrics(accept))
        if path == "/healthz":
            return answers.later(self._healthz)
        if path == "/v1/models":
            return answers.later(self._models)
        if match := _V1_MODEL.match(path):
            model = service.models().get(match.group(1))
            if model is None:
                raise RequestError(404, "not-found", f"no model named {match.group(1)!r} is served here")
            entry = openai_api.model_entry(model.manifest, self.started)
            return answers.later(lambda: answers.json({**service.describe(model), **entry}))
        if _V1_INFER.match(path):
            return answers.error(RequestError(405, "bad-request", "use POST for inference"), allow="POST")
        raise RequestError(404, "not-found", f"no such endpoint {path}")

    def _served(self, name: str) -> None:
        if name not in self.service.models():
            served = ", ".join(sorted(self.service.models())) or "none"
            raise RequestError(404, "not-found", f"no model named {name!r} is served here (serving: {served})")

    def _models(self) -> Response:
        """edgefleet's list (`models`: every slot's model) and OpenAI's (`object`, `data`: the generative ones, which
        its completions and chat serve) in one answer."""
        models = sorted(self.service.models().items())
        return self.answers.json({
            "object": "list",
            "data": [openai_api.model_entry(m.manifest, self.started) for _, m in models if m.manifest.generation],
            "models": [self.service.describe(m) for _, m in models],
        })  # fmt: skip

    def _metrics(self, accept: str) -> Response:
        page, content_type = self.service.render_metrics(accept)
        return Response(200, page, content_type)

    def _healthz(self) -> Response:
        models = self.service.models()
        return self.answers.json({"status": "ok" if models else "no-model", "models": sorted(models)})

    def _infer_v1(self, ticket: Admitted, head: Head, body: bytes) -> Response:
        service, model = self.service, ticket.model
        manifest = model.manifest
        name = manifest.model_name
        try:
            content_type = head.headers.get("content-type", JSON)
            decoded = decode_guarded(
                lambda: decode_body(body, content_type, manifest, service.config.max_decoded_bytes)
            )
            answer = answer_format(head.headers.get("accept", ""), decoded.format, len(manifest.outputs))
            outputs, latency_ms = ticket.run(decoded.feeds)
            encoded = {k: tensor_json(k, v) for k, v in outputs.items()} if answer == JSON else None
        except RequestError as err:
            return self.answers.error(err, name)
        request_id = ticket.remember(decoded.feeds, outputs)
        headers = {"X-Model": name, "X-Bundle-Id": model.bundle_id, "X-Provider": model.provider,
                   "X-Latency-Ms": f"{latency_ms:.4f}", "X-Request-Id": request_id}  # fmt: skip
        self.answers.count(name, 200)
        if encoded is not None:
            document = {
                "request_id": request_id,
                "model": name,
                "model_version": manifest.model_version,
                "bundle_id": model.bundle_id,
                "provider": model.provider,
                "latency_ms": round(latency_ms, 4),
                "outputs": encoded,
            }
            if manifest.class_labels:  # ZipMap outputs turned into tensors: each column's class
                document["class_labels"] = {k: list(v) for k, v in manifest.class_labels.items()}
            return Response(200, json.dumps(document).encode(), JSON, headers)
        return Response(200, encode_outputs(outputs, answer), answer, headers)
