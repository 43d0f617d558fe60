"""Every answer of the local API, counted in one place: requests by (model, code), every answer but 200 by kind.

The /v1 routes (agent/api/routes.py) and the Open Inference Protocol routes (agent/api/oip_routes.py) both answer
through an `Answers`. Every error answer has the same form: `{"error": ...}` with the kind in `X-Error-Kind`; the
error is the object of `error_object` (OpenAI's fields and edgefleet's `kind`) on /v1 and the OpenAI-compatible
endpoints, and the message string on /v2 (the Open Inference Protocol and Triton's generate require a string).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.http.protocol import Admission, Response
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.api.served import Serving
from edgefleet.agent.api.wire import JSON

SMALL_BODY_S = 10.0  # the body deadline of endpoints whose bodies are small (feedback, generation requests)


def error_object(err: RequestError) -> dict[str, Any]:
    """The error of every endpoint but OIP's (whose protocol makes it a string): edgefleet's `kind` and `message`
    and OpenAI's `message`, `type`, `param` and `code` in one object, so either kind of client reads it."""
    return {"message": err.message, "kind": err.kind, "type": err.kind, "param": None, "code": str(err.status)}


class Answers:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def count(self, model: str, status: int, kind: str = "") -> None:
        self.metrics.requests.inc(model, str(status))
        if status != 200:
            self.metrics.error(kind)

    def error(self, err: RequestError, model: str = "-", *, oip: bool = False, allow: str = "") -> Response:
        self.count(model, err.status, err.kind)
        headers = {"X-Error-Kind": err.kind}
        if allow:
            headers["Allow"] = allow
        if err.status == 503:
            headers["Retry-After"] = "1"
        detail: Any = err.message if oip else error_object(err)
        return Response(err.status, json.dumps({"error": detail}).encode(), JSON, headers)

    def refused(self, status: int, message: str) -> Response:
        """The server's own refusal of a request it could not read (too large, too slow, full)."""
        kind = {413: "too-large", 408: "timeout", 503: "overloaded"}.get(status, "bad-request")
        return self.error(RequestError(status, kind, message))

    def json(self, document: Any, model: str = "-", status: int = 200) -> Response:
        self.count(model, status)
        return Response(status, json.dumps(document).encode(), JSON)

    def later(self, answer: Callable[[], Response]) -> Admission:
        """A request without a model slot, answered by a worker (never on the I/O thread)."""
        return Admission(lambda body: answer())

    def feedback(self, service: Serving, name: str, body: bytes, *, oip: bool = False) -> Response:
        """POST .../feedback on either API: the true label of an earlier answer."""
        try:
            return self.json(service.feedback(name, body), name)
        except RequestError as err:
            return self.error(err, name, oip=oip)


__all__ = ["SMALL_BODY_S", "Answers", "error_object"]
