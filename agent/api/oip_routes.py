"""The Open Inference Protocol v2 REST API (KServe, Triton, OpenVINO Model Server, MLServer).

    GET  /v2                                         server metadata (name, version, extensions)
    GET  /v2/health/live, /v2/health/ready           {"live": true} / {"ready": true} (503 when no model)
    GET  /v2/models/{name}[/versions/{v}]            model metadata: versions, platform, inputs, outputs
                                                     (`name`: a slot's model name, or the slot's own name)
    GET  /v2/models/{name}[/versions/{v}]/ready      200 {"name", "ready": true}, 404 when not served
    POST /v2/models/{name}[/versions/{v}]/infer      JSON tensors, or binary tensor data after a JSON header
                                                     (Inference-Header-Content-Length); outputs as JSON or
                                                     binary (per output `binary_data`, or `binary_data_output`)
    POST /v2/models/{name}[/versions/{v}]/feedback   {"id" (the request's OIP id) or "request_id", "label"}
    POST /v2/repository/index                        [{"name", "version", "state", "reason", "slot"}]: every
                                                     slot's model, READY when it serves, else LOADING or
                                                     UNAVAILABLE with the reason (a refusal: over the memory budget)
    POST /v2/models/{name}[/versions/{v}]/generate, /generate_stream   Triton's generate extension (generative
                                                     models; agent/api/generation/triton_api.py)

Errors are OIP's {"error": "message"} with the kind in the X-Error-Kind header: 400, 404, 413, 503 as on /v1.
Loading and unloading through the repository API is refused (403): bundles arrive signed, over MQTT.
"""

from __future__ import annotations

import re

from edgefleet import __version__
from edgefleet.agent.api.answers import SMALL_BODY_S, Answers
from edgefleet.agent.api.body_guard import decode_guarded
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.routes import GenerationRoutes
from edgefleet.agent.api.http.protocol import Admission, Head, Response
from edgefleet.agent.api.oip import HEADER_LENGTH, decode_request, encode_response, model_metadata
from edgefleet.agent.api.place import Place
from edgefleet.agent.api.served import Admitted, ServedModel, Serving

_MODEL = re.compile(r"^/v2/models/([A-Za-z0-9._-]{1,64})(?:/versions/([A-Za-z0-9._-]{1,64}))?(/[a-z_]+)?$")
_REPOSITORY = re.compile(r"^/v2/repository/models/([A-Za-z0-9._-]{1,64})/(load|unload)$")
EXTENSIONS = ["binary_tensor_data", "model_repository", "generate"]


class RoutesV2:
    def __init__(self, service: Serving, answers: Answers, generation: GenerationRoutes) -> None:
        self.service, self.answers, self.generation = service, answers, generation

    def admit(self, head: Head, length: int) -> Response | Admission:
        try:
            return self._admit(head, length)
        except RequestError as err:
            match = _MODEL.match(head.path)
            return self.answers.error(err, match.group(1) if match else "-", oip=True)

    def _admit(self, head: Head, length: int) -> Response | Admission:
        answers, service, path = self.answers, self.service, head.path
        if head.method == "GET":
            if path == "/v2":
                document = {"name": "edgefleet-agent", "version": __version__, "extensions": EXTENSIONS}
                return answers.later(lambda: answers.json(document))
            if path == "/v2/health/live":
                return answers.later(lambda: answers.json({"live": True}))
            if path == "/v2/health/ready":
                return answers.later(self._ready)
        match = _MODEL.match(path)
        if match is not None:
            name, version, action = match.group(1), match.group(2), match.group(3) or ""
            if head.method == "POST" and action in ("/generate", "/generate_stream"):
                return self.generation.triton(head, name, version, length, stream=action == "/generate_stream")
            if head.method == "POST" and action == "/infer":
                self._model(name, version)  # 404 from the head; the queue place is taken once the body is complete
                place: Place[Admitted] = Place(
                    lambda: service.admit(name, version), lambda err: answers.error(err, name, oip=True)
                )
                return place.admission(lambda body: self._infer(place.held, head, body), lambda: place.held.quick(),
                                       service.config.body_timeout_s)  # fmt: skip
            if head.method == "POST" and action == "/feedback":
                self._model(name, version)
                return Admission(lambda body: answers.feedback(service, name, body, oip=True),
                                 body_timeout_s=SMALL_BODY_S)  # fmt: skip
            if head.method == "GET" and action in ("", "/ready"):
                model = self._model(name, version)
                if action == "/ready":
                    return answers.later(lambda: answers.json({"name": name, "ready": True}, name))
                return answers.later(lambda: answers.json(model_metadata(model.manifest), name))
            if action in ("", "/ready", "/infer", "/feedback", "/generate", "/generate_stream"):
                allowed = "GET" if action in ("", "/ready") else "POST"
                raise RequestError(405, "bad-request", f"use {allowed} for {path}")
        if path == "/v2/repository/index" and head.method == "POST":
            return answers.later(self._index)
        if _REPOSITORY.match(path):
            raise RequestError(403, "bad-request", "models are installed as signed bundles by the control plane; "
                               "the repository API cannot load or unload them")  # fmt: skip
        raise RequestError(404, "not-found", f"no such endpoint {head.method} {path}")

    def _model(self, name: str, version: str | None) -> ServedModel:
        model = self.service.lookup(name)
        if model is None:
            served = ", ".join(sorted(self.service.models())) or "none"
            raise RequestError(404, "not-found", f"no model named {name!r} is served here (serving: {served})")
        if version is not None and version != model.manifest.model_version:
            raise RequestError(404, "not-found", f"model {name!r} has no version {version!r} here")
        return model

    def _ready(self) -> Response:
        if self.service.models():
            return self.answers.json({"ready": True})
        return self.answers.error(RequestError(503, "overloaded", "no model is installed yet"), oip=True)

    def _index(self) -> Response:
        service = self.service
        index = [
            {"name": name, "version": model.manifest.model_version, "state": "READY", "reason": "",
             "slot": service.slot_of(name)}
            for name, model in sorted(service.models().items())
        ]  # fmt: skip
        for slot, name, state, reason in service.repository():
            index.append({"name": name or slot, "version": "", "state": state, "reason": reason, "slot": slot})
        return self.answers.json(index)

    def _infer(self, ticket: Admitted, head: Head, body: bytes) -> Response:
        service, model = self.service, ticket.model
        manifest = model.manifest
        name = manifest.model_name
        if head.headers.get("content-encoding", "identity").lower() != "identity":
            error = RequestError(415, "bad-request", "compressed request bodies are not accepted")
            return self.answers.error(error, name, oip=True)
        try:
            request = decode_guarded(
                lambda: decode_request(body, head.headers.get(HEADER_LENGTH.lower()), manifest,
                                       service.config.max_decoded_bytes)
            )  # fmt: skip
            outputs, latency_ms = ticket.run(request.feeds)
            request_id = ticket.remember(request.feeds, outputs, request.id)
            payload, content_type, headers = encode_response(
                request, name, manifest.model_version, request.id or request_id, outputs, manifest.class_labels
            )
        except RequestError as err:
            return self.answers.error(err, name, oip=True)
        headers.update({"X-Request-Id": request_id, "X-Bundle-Id": model.bundle_id, "X-Provider": model.provider,
                        "X-Latency-Ms": f"{latency_ms:.4f}"})  # fmt: skip
        self.answers.count(name, 200)
        return Response(200, payload, content_type, headers)
