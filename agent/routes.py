"""Which request goes where, decided from the head alone (agent/http_server.py's `App`), and the /v1 API.

Every answer is counted here: requests by (model, code), and every answer but 200 by kind. A body that
cannot be decoded, whatever the exception, is a 400 (a MemoryError a 413): it never reaches the model and
never counts as a model failure.

    /v2/...                        the Open Inference Protocol (agent/routes_v2.py), the primary API
    POST /v1/models/{name}/infer   JSON {"inputs": {input: {"dtype", "shape", "data"}}}, a .npz body
                                   (application/x-npz) or a .npy body (application/x-npy, single input);
                                   the answer has the request's format unless `Accept` asks for another
    POST /v1/models/{name}/feedback  {"request_id": ..., "label": N}
    GET  /v1/models, /v1/models/{name}, /healthz, /metrics (Prometheus text, or OpenMetrics on request)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgefleet.agent.api_errors import RequestError
from edgefleet.agent.body_guard import decode_guarded
from edgefleet.agent.http_protocol import Admission, Head, Response
from edgefleet.agent.routes_v2 import RoutesV2
from edgefleet.agent.wire import JSON, answer_format, decode_body, encode_outputs, tensor_json

if TYPE_CHECKING:
    from edgefleet.agent.service import InferenceService, Ticket

_NAME = r"([A-Za-z0-9._-]{1,64})"
_V1_INFER = re.compile(rf"^/v1/models/{_NAME}/infer$")
_V1_MODEL = re.compile(rf"^/v1/models/{_NAME}$")
_V1_FEEDBACK = re.compile(rf"^/v1/models/{_NAME}/feedback$")


class Routes:
    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.v2 = RoutesV2(self)

    # --- the App interface
    def admit(self, head: Head, length: int) -> Response | Admission:
        if head.path.startswith("/v2"):
            return self.v2.admit(head, length)
        try:
            return self._admit_v1(head)
        except RequestError as err:
            model = m.group(1) if (m := _V1_INFER.match(head.path) or _V1_FEEDBACK.match(head.path)) else "-"
            return self.error(err, model)

    def refused(self, status: int, message: str) -> Response:
        kind = {413: "too-large", 408: "timeout", 503: "overloaded"}.get(status, "bad-request")
        return self.error(RequestError(status, kind, message))

    # --- answers, each counted
    def count(self, model: str, status: int, kind: str = "") -> None:
        metrics = self.service.metrics
        metrics.requests.inc(model, str(status))
        if status != 200:
            metrics.error(kind)

    def error(self, err: RequestError, model: str = "-", *, oip: bool = False, allow: str = "") -> Response:
        self.count(model, err.status, err.kind)
        headers = {"X-Error-Kind": err.kind}
        if allow:
            headers["Allow"] = allow
        if err.status == 503:
            headers["Retry-After"] = "1"
        detail: Any = err.message if oip else {"kind": err.kind, "message": err.message}
        return Response(err.status, json.dumps({"error": detail}).encode(), JSON, headers)

    def json(self, document: Any, model: str = "-", status: int = 200) -> Response:
        self.count(model, status)
        return Response(status, json.dumps(document).encode(), JSON)

    def later(self, answer: Callable[[], Response]) -> Admission:
        """A request without a model slot, answered by a worker (never on the I/O thread)."""
        return Admission(lambda body: answer())

    # --- /v1 and the shared endpoints
    def _admit_v1(self, head: Head) -> Response | Admission:
        service, path = self.service, head.path
        if head.method == "POST":
            if match := _V1_INFER.match(path):
                ticket = service.admit(match.group(1))
                return Admission(lambda body: self._infer_v1(ticket, head, body), ticket.release, ticket.quick)
            if match := _V1_FEEDBACK.match(path):
                name = match.group(1)
                return Admission(lambda body: self._feedback(name, body))
            raise RequestError(404, "not-found", f"no such endpoint {path} (POST /v2/models/NAME/infer)")
        if head.method != "GET":
            return self.error(RequestError(405, "bad-request", f"method {head.method} not allowed"), allow="GET, POST")
        if path == "/metrics":
            accept = head.headers.get("accept", "")
            return self.later(lambda: self._metrics(accept))
        if path == "/healthz":
            return self.later(self._healthz)
        if path == "/v1/models":
            return self.later(
                lambda: self.json({"models": [service.describe(m) for _, m in sorted(service.models().items())]})
            )
        if match := _V1_MODEL.match(path):
            model = service.models().get(match.group(1))
            if model is None:
                raise RequestError(404, "not-found", f"no model named {match.group(1)!r} is served here")
            return self.later(lambda: self.json(service.describe(model)))
        if _V1_INFER.match(path):
            return self.error(RequestError(405, "bad-request", "use POST for inference"), allow="POST")
        raise RequestError(404, "not-found", f"no such endpoint {path}")

    def _metrics(self, accept: str) -> Response:
        page, content_type = self.service.render_metrics(accept)
        return Response(200, page, content_type)

    def _healthz(self) -> Response:
        models = self.service.models()
        return self.json({"status": "ok" if models else "no-model", "models": sorted(models)})

    def _feedback(self, name: str, body: bytes, *, oip: bool = False) -> Response:
        try:
            return self.json(self.service.feedback(name, body), name)
        except RequestError as err:
            return self.error(err, name, oip=oip)

    def _infer_v1(self, ticket: Ticket, head: Head, body: bytes) -> Response:
        service, model = self.service, ticket.model
        manifest = model.manifest
        name = manifest.model_name
        try:
            content_type = head.headers.get("content-type", JSON)
            decoded = decode_guarded(
                lambda: decode_body(body, content_type, manifest, service.config.max_decoded_bytes)
            )
            answer = answer_format(head.headers.get("accept", ""), decoded.format, len(manifest.outputs))
            outputs, latency_ms = service.run(ticket, decoded.feeds)
        except RequestError as err:
            return self.error(err, name)
        request_id = service.remember(ticket, decoded.feeds, outputs)
        headers = {"X-Model": name, "X-Bundle-Id": model.bundle_id, "X-Provider": model.provider,
                   "X-Latency-Ms": f"{latency_ms:.4f}", "X-Request-Id": request_id}  # fmt: skip
        self.count(name, 200)
        if answer == JSON:
            document = {
                "request_id": request_id,
                "model": name,
                "model_version": manifest.model_version,
                "bundle_id": model.bundle_id,
                "provider": model.provider,
                "latency_ms": round(latency_ms, 4),
                "outputs": {k: tensor_json(v) for k, v in outputs.items()},
            }
            if manifest.class_labels:  # ZipMap outputs turned into tensors: each column's class
                document["class_labels"] = {k: list(v) for k, v in manifest.class_labels.items()}
            return Response(200, json.dumps(document).encode(), JSON, headers)
        return Response(200, encode_outputs(outputs, answer), answer, headers)
