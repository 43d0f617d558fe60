"""The local inference API for applications on the device: HTTP on 127.0.0.1 or on a Unix socket.

    POST /v1/models/{name}/infer   JSON {"inputs": {input: {"dtype", "shape", "data"}}}, or a .npz body
                                   (application/x-npz, one array per input), or a .npy body
                                   (application/x-npy, single-input models). The answer has the request's
                                   format unless `Accept` asks for another (application/json, x-npz, x-npy).
    GET  /v1/models                what is served: name, version, bundle, provider and why, signature
    GET  /v1/models/{name}         one of them
    GET  /healthz                  liveness, with the models served
    GET  /metrics                  Prometheus text (agent/metrics.py)

Bad input gets a JSON error {"error": {"kind", "message"}}: 400 for names, dtypes and shapes (symbolic
dimensions accept any size), 404 for an unknown model, 411 without Content-Length, 413 above the body
limit, 415 for another content type, 503 when the bounded queue is full. Each is counted by kind.

Concurrency: every connection has a thread (keep-alive); at most `concurrency` requests run inference at
once, at most `queue_size` more wait, and the rest are refused with 503 at once. `swap(model)` replaces
a model atomically: requests already holding the old model finish on it; `wait_idle(old)` says when the
old one is no longer used. Nothing is unpickled: .npz and .npy bodies are read with allow_pickle=False.
Dynamic batching is not done: requests run one by one on the runtime's own threads.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent.feedback import FeedbackError, FieldAccuracy
from edgefleet.agent.http_server import RequestHandler, TCPServer, TCPServer6, UnixServer
from edgefleet.agent.metrics import ServiceMetrics
from edgefleet.agent.wire import (
    JSON,
    NPY,
    NPZ,
    Decoded,
    RequestError,
    answer_format,
    decode_body,
    encode_outputs,
    load_npy,
    save_npy,
    tensor_json,
)
from edgefleet.core.errors import DataError
from edgefleet.core.manifest import Manifest

log = logging.getLogger(__name__)


class ServedModel(Protocol):
    """What the service needs of a model (agent.runtime.LoadedModel is one)."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def bundle_id(self) -> str: ...

    @property
    def provider(self) -> str: ...

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class ServiceConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="a loopback address: the API has no authentication")
    port: int = Field(default=8470, ge=0, le=65535, description="TCP port; 0 picks a free one")
    unix_socket: Path | None = Field(default=None, description="serve on this Unix socket instead of TCP")
    socket_mode: int = Field(default=0o660, description="permissions of the Unix socket")
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="larger requests get 413")
    concurrency: int = Field(default=2, ge=1, description="requests running inference at once")
    queue_size: int = Field(default=64, ge=0, description="requests waiting for a slot; beyond that 503")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="longest wait for a slot before 503")
    keep_alive_s: float = Field(default=30.0, gt=0, description="idle keep-alive connections close after this")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class InferenceService:
    """The HTTP server, the models it serves and its metrics. `start()` returns at once; `stop()` drains."""

    def __init__(
        self,
        models: Iterable[ServedModel] = (),
        config: ServiceConfig | None = None,
        metrics: ServiceMetrics | None = None,
        on_answer: Callable[[float], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        """`on_answer(latency_ms)` / `on_failure()` let the agent count HTTP requests in its telemetry and health."""
        self.config = config or ServiceConfig()
        self._on_answer, self._on_failure = on_answer, on_failure
        if self.config.unix_socket is None and not _is_loopback(self.config.host):
            raise ValueError(
                f"the inference API binds loopback only (it has no authentication), not {self.config.host}"
            )
        self.field = FieldAccuracy()
        self.metrics = metrics or ServiceMetrics()
        self._models: dict[str, ServedModel] = {}
        self._models_lock = threading.Lock()
        for model in models:
            self._models[model.manifest.model_name] = model
        self._slots = threading.BoundedSemaphore(self.config.concurrency)
        self._count_lock = threading.Condition()
        self._pending = 0  # admitted: waiting or running
        self._running = 0
        self._using: dict[int, int] = {}  # id(model) -> requests using it
        self._server: socketserver.BaseServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.metrics.queue_depth = lambda: max(0, self._pending - self._running)
        self.metrics.in_flight = lambda: self._running
        self.metrics.models = lambda: [(n, m.bundle_id, m.provider) for n, m in sorted(self._models.items())]
        self.metrics.field_accuracy = lambda: [
            (n, score.accuracy, score.samples)
            for n in sorted(self._models)
            if (score := self.field.score(n)).accuracy is not None
        ]

    # --- models
    def models(self) -> dict[str, ServedModel]:
        return dict(self._models)

    def swap(self, model: ServedModel, replaces: str | None = None) -> ServedModel | None:
        """Serve `model` under its name from now on (and stop serving `replaces`); returns the model it replaced.

        Requests that already hold the old model finish on it; new ones get `model`. None are dropped.
        """
        name = model.manifest.model_name
        with self._models_lock:
            models = dict(self._models)
            old = models.get(name)
            if replaces and replaces != name:
                old = models.pop(replaces, None) or old
            models[name] = model
            self._models = models  # one reference assignment: readers see the old dict or the new one
        self.metrics.swaps.inc(name)
        log.info("serving %s from bundle %s on %s", name, model.bundle_id, model.provider)
        return old

    def remove(self, name: str) -> ServedModel | None:
        with self._models_lock:
            models = dict(self._models)
            old = models.pop(name, None)
            self._models = models
        return old

    def wait_idle(self, model: ServedModel, timeout_s: float = 30.0) -> bool:
        """True once no request is using `model` (after a swap, before closing it)."""
        deadline = time.monotonic() + timeout_s
        with self._count_lock:
            while self._using.get(id(model), 0):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._count_lock.wait(left)
        return True

    # --- lifecycle
    @property
    def address(self) -> str:
        if self.config.unix_socket is not None:
            return f"unix:{self.config.unix_socket}"
        return f"http://{self.config.host}:{self.port}"

    @property
    def port(self) -> int:
        if self._server is None or self.config.unix_socket is not None:
            return self.config.port
        return int(self._server.server_address[1])  # type: ignore[index]

    def start(self) -> InferenceService:
        handler = type("Connection", (RequestHandler,), {"service": self, "timeout": self.config.keep_alive_s})
        if self.config.unix_socket is not None:
            path = self.config.unix_socket
            if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                path.unlink()  # left by an earlier agent; binding would fail
            self._server = UnixServer(str(path), handler)
            os.chmod(path, self.config.socket_mode)
        else:
            server_class = TCPServer6 if ":" in self.config.host else TCPServer
            self._server = server_class((self.config.host, self.config.port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="inference-api", daemon=True
        )
        self._thread.start()
        log.info("inference API on %s", self.address)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let running requests finish (up to `grace_s`), then close every connection."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._count_lock:
            deadline = time.monotonic() + grace_s
            while self._pending and time.monotonic() < deadline:
                self._count_lock.wait(0.05)
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self.config.unix_socket is not None:
            self.config.unix_socket.unlink(missing_ok=True)
        self._server = None

    def __enter__(self) -> InferenceService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- requests
    def infer(self, name: str, body: bytes, content_type: str, accept: str) -> tuple[bytes, str, dict[str, str]]:
        """One inference request → (body, content type, extra headers). Raises RequestError."""
        model = self._models.get(name)
        if model is None:
            served = ", ".join(sorted(self._models)) or "none"
            raise RequestError(404, "not-found", f"no model named {name!r} is served here (serving: {served})")
        with self._count_lock:
            if self._pending >= self.config.concurrency + self.config.queue_size:
                raise RequestError(503, "overloaded", f"queue full ({self.config.queue_size} waiting); retry later")
            self._pending += 1
            self._using[id(model)] = self._using.get(id(model), 0) + 1
        try:
            decoded = decode_body(body, content_type, model.manifest)
            if not self._slots.acquire(timeout=self.config.queue_timeout_s):
                raise RequestError(503, "timeout", f"no inference slot within {self.config.queue_timeout_s:g} s")
            with self._count_lock:
                self._running += 1
            try:
                start = time.perf_counter()
                outputs = model.run(decoded.feeds)
                latency_ms = (time.perf_counter() - start) * 1000
            finally:
                with self._count_lock:
                    self._running -= 1
                self._slots.release()
        except DataError as err:
            raise RequestError(400, "bad-request", str(err)) from err
        except RequestError:
            raise
        except Exception as err:  # a runtime failure answers this request; the service stays up
            log.exception("inference failed on %s", model.bundle_id)
            if self._on_failure is not None:
                self._on_failure()
            raise RequestError(500, "runtime", f"inference failed: {type(err).__name__}: {err}") from err
        finally:
            with self._count_lock:
                self._pending -= 1
                left = self._using[id(model)] - 1
                if left:
                    self._using[id(model)] = left
                else:
                    del self._using[id(model)]
                self._count_lock.notify_all()
        self.metrics.observe(name, model.bundle_id, model.provider, latency_ms)
        if self._on_answer is not None:
            self._on_answer(latency_ms)
        request_id = self.field.remember(name, outputs)
        headers = {"X-Model": name, "X-Bundle-Id": model.bundle_id, "X-Provider": model.provider,
                   "X-Latency-Ms": f"{latency_ms:.4f}", "X-Request-Id": request_id}  # fmt: skip
        answer = answer_format(accept, decoded.format, len(outputs))
        if answer == JSON:
            document = {
                "request_id": request_id,
                "model": name,
                "model_version": model.manifest.model_version,
                "bundle_id": model.bundle_id,
                "provider": model.provider,
                "latency_ms": round(latency_ms, 4),
                "outputs": {k: tensor_json(v) for k, v in outputs.items()},
            }
            return json.dumps(document).encode(), JSON, headers
        return encode_outputs(outputs, answer), answer, headers

    def feedback(self, name: str, body: bytes) -> dict[str, Any]:
        """POST /v1/models/{name}/feedback {"request_id": ..., "label": N}: the true class of an earlier answer."""
        try:
            document = json.loads(body)
            request_id, label = str(document["request_id"]), document["label"]
        except (ValueError, KeyError, TypeError) as err:
            raise RequestError(400, "bad-request", 'feedback must be JSON {"request_id": "...", "label": N}') from err
        if isinstance(label, bool) or not isinstance(label, int):
            raise RequestError(400, "bad-request", f"label must be an integer class index, not {label!r}")
        try:
            correct = self.field.feedback(name, request_id, label)
        except FeedbackError as err:
            raise RequestError(404, "not-found", str(err)) from err
        score = self.field.score(name)
        return {"correct": correct, "field_accuracy": score.accuracy, "samples": score.samples}

    def describe(self, model: ServedModel) -> dict[str, Any]:
        manifest = model.manifest
        choice = getattr(model, "choice", None)
        golden = getattr(model, "last_golden", None)
        return {
            "name": manifest.model_name,
            "version": manifest.model_version,
            "bundle_id": model.bundle_id,
            "profile": manifest.profile,
            "format": manifest.format,
            "precision": manifest.recipe.precision,
            "provider": model.provider,
            "provider_summary": getattr(choice, "summary", None),
            "providers_not_chosen": getattr(choice, "reasons", {}),
            "load_ms": getattr(model, "load_ms", None),
            "golden": None if golden is None else {"passed": golden.passed, "reason": golden.reason},
            "inputs": [spec.model_dump() for spec in manifest.inputs],
            "outputs": [spec.model_dump() for spec in manifest.outputs],
        }


__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "Decoded",
    "InferenceService",
    "RequestError",
    "ServedModel",
    "ServiceConfig",
    "decode_body",
    "encode_outputs",
    "load_npy",
    "save_npy",
]
