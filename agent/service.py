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
import io
import ipaddress
import json
import logging
import os
import re
import socket
import socketserver
import stat
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgefleet.agent.metrics import ServiceMetrics
from edgefleet.core.errors import DataError
from edgefleet.core.manifest import Manifest

log = logging.getLogger(__name__)

JSON, NPZ, NPY = "application/json", "application/x-npz", "application/x-npy"
_INFER = re.compile(r"^/v1/models/([A-Za-z0-9._-]{1,64})/infer$")
_MODEL = re.compile(r"^/v1/models/([A-Za-z0-9._-]{1,64})$")
_DTYPE_KINDS = "biuf"  # bool, signed, unsigned, float: what a model input can be


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


class RequestError(Exception):
    """An answer other than 200, with the error kind it is counted under."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass(frozen=True)
class Decoded:
    feeds: dict[str, np.ndarray]
    format: str  # JSON, NPZ or NPY


def decode_body(body: bytes, content_type: str, manifest: Manifest) -> Decoded:
    """Request body → input arrays (names, dtypes and shapes are checked later by the model)."""
    kind = content_type.split(";", 1)[0].strip().lower() or JSON
    if kind == JSON:
        return Decoded(_decode_json(body), JSON)
    if kind == NPZ:
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as archive:
                feeds = {name: archive[name] for name in archive.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, AttributeError, TypeError) as err:
            raise RequestError(400, "bad-request", f"body is not a readable .npz without pickles: {err}") from err
        return Decoded(feeds, NPZ)
    if kind == NPY:
        if len(manifest.inputs) != 1:
            names = [spec.name for spec in manifest.inputs]
            raise RequestError(
                400, "bad-request", f"a .npy body fits single-input models only; this one takes {names}: send .npz"
            )
        return Decoded({manifest.inputs[0].name: load_npy(body)}, NPY)
    raise RequestError(415, "bad-request", f"content type {kind!r} is not accepted; use {JSON}, {NPZ} or {NPY}")


def _decode_json(body: bytes) -> dict[str, np.ndarray]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, "bad-request", f"body is not valid JSON: {err}") from err
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, dict):
        raise RequestError(400, "bad-request", 'JSON body must be {"inputs": {name: {"dtype", "shape", "data"}}}')
    return {str(name): _json_tensor(str(name), value) for name, value in inputs.items()}


def _json_tensor(name: str, value: Any) -> np.ndarray:
    if not isinstance(value, dict) or not {"dtype", "shape", "data"} <= set(value):
        raise RequestError(400, "bad-request", f"input {name!r} must be an object with dtype, shape and data")
    try:
        dtype = np.dtype(value["dtype"])
    except (TypeError, ValueError) as err:
        raise RequestError(400, "bad-request", f"input {name!r}: unknown dtype {value['dtype']!r}") from err
    if dtype.kind not in _DTYPE_KINDS:
        raise RequestError(400, "bad-request", f"input {name!r}: dtype {dtype} is not a numeric or bool dtype")
    shape = value["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise RequestError(400, "bad-request", f"input {name!r}: shape must be a list of non-negative integers")
    try:
        array = np.array(value["data"], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise RequestError(400, "bad-request", f"input {name!r}: data does not convert to {dtype}: {err}") from err
    if list(array.shape) != shape:
        if array.size != int(np.prod(shape)):
            raise RequestError(
                400, "bad-request", f"input {name!r}: data holds {array.size} values, shape {shape} needs "
                f"{int(np.prod(shape))}"
            )  # fmt: skip
        array = array.reshape(shape)  # flat data of the right size is accepted
    return array


def _tensor_json(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": array.tolist()}


_NPY_IN: dict[bytes, tuple[np.dtype[Any], tuple[int, ...]]] = {}  # .npy header -> (dtype, shape)
_NPY_OUT: dict[tuple[str, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> .npy header
_NPY_CACHE_SIZE = 256


def load_npy(body: bytes) -> np.ndarray:
    """A .npy body as a read-only array over the body, without pickles.

    Clients send the same dtype and shape again and again, so each distinct header is parsed once (numpy's
    own parser, which evaluates the header with `ast` and costs tens of microseconds) and then reused.
    """
    major = body[6] if len(body) > 10 and body[:6] == b"\x93NUMPY" else 0
    size = {1: 2, 2: 4}.get(major)
    if size is None:  # not .npy, or version 3 (utf-8 header): numpy's general reader decides
        return _load_npy_slow(body)
    offset = 8 + size + int.from_bytes(body[8 : 8 + size], "little")
    header = body[:offset]
    parsed = _NPY_IN.get(header)
    if parsed is None:
        stream = io.BytesIO(body)
        try:
            np.lib.format.read_magic(stream)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(stream)
        except (ValueError, OSError, EOFError) as err:
            raise RequestError(400, "bad-request", f"body is not a readable .npy: {err}") from err
        if dtype.hasobject:
            raise RequestError(400, "bad-request", "object arrays are not accepted (they would need pickles)")
        if fortran:
            return _load_npy_slow(body)
        if len(_NPY_IN) >= _NPY_CACHE_SIZE:
            _NPY_IN.clear()
        parsed = _NPY_IN[header] = (dtype, tuple(shape))
    dtype, shape = parsed
    count = int(np.prod(shape))
    if len(body) - offset < count * dtype.itemsize:
        raise RequestError(400, "bad-request", f".npy body is truncated: shape {list(shape)} needs more data")
    return np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)


def _load_npy_slow(body: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise RequestError(400, "bad-request", f"body is not a readable .npy without pickles: {err}") from err
    if not isinstance(array, np.ndarray):
        raise RequestError(400, "bad-request", "body is an .npz archive; send it as application/x-npz")
    return array


def save_npy(array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array)
    key = (array.dtype.str, array.shape)
    header = _NPY_OUT.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        whole = buffer.getvalue()
        if len(_NPY_OUT) >= _NPY_CACHE_SIZE:
            _NPY_OUT.clear()
        header = _NPY_OUT[key] = whole[: len(whole) - array.nbytes]
    return header + array.tobytes()


def encode_outputs(outputs: Mapping[str, np.ndarray], kind: str) -> bytes:
    if kind == NPY:
        return save_npy(next(iter(outputs.values())))
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)  # type: ignore[arg-type]
    return buffer.getvalue()


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
    ) -> None:
        self.config = config or ServiceConfig()
        if self.config.unix_socket is None and not _is_loopback(self.config.host):
            raise ValueError(
                f"the inference API binds loopback only (it has no authentication), not {self.config.host}"
            )
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
        handler = type("Connection", (_Connection,), {"service": self, "timeout": self.config.keep_alive_s})
        if self.config.unix_socket is not None:
            path = self.config.unix_socket
            if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                path.unlink()  # left by an earlier agent; binding would fail
            self._server = _UnixServer(str(path), handler)
            os.chmod(path, self.config.socket_mode)
        else:
            server_class = _TCPServer6 if ":" in self.config.host else _TCPServer
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
        headers = {"X-Model": name, "X-Bundle-Id": model.bundle_id, "X-Provider": model.provider,
                   "X-Latency-Ms": f"{latency_ms:.4f}"}  # fmt: skip
        answer = _answer_format(accept, decoded.format, len(outputs))
        if answer == JSON:
            document = {
                "model": name,
                "model_version": model.manifest.model_version,
                "bundle_id": model.bundle_id,
                "provider": model.provider,
                "latency_ms": round(latency_ms, 4),
                "outputs": {k: _tensor_json(v) for k, v in outputs.items()},
            }
            return json.dumps(document).encode(), JSON, headers
        return encode_outputs(outputs, answer), answer, headers

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


def _answer_format(accept: str, request_format: str, output_count: int) -> str:
    accepted = [part.split(";", 1)[0].strip().lower() for part in accept.split(",") if part.strip()]
    for kind in accepted:
        if kind in (JSON, NPZ) or (kind == NPY and output_count == 1):
            return kind
    if accepted and "*/*" not in accepted and "application/*" not in accepted:
        raise RequestError(406, "bad-request", f"cannot answer as {accept!r}; use {JSON}, {NPZ} or {NPY}")
    if request_format == NPY and output_count != 1:
        return NPZ
    return request_format


class _BadHead(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class _Head:
    method: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


_MAX_LINE = 8192
_MAX_HEADERS = 64
_DATE = {"second": 0, "text": ""}


def _http_date() -> str:
    now = int(time.time())
    if _DATE["second"] != now:
        _DATE["text"] = formatdate(now, usegmt=True)
        _DATE["second"] = now
    return str(_DATE["text"])


class _Connection(socketserver.StreamRequestHandler):
    """One keep-alive connection: a lean HTTP/1.1 reader (request line, headers, Content-Length body).

    http.server's handler parses headers with the email package and writes headers and body separately;
    at a few tens of microseconds per inference that doubled the API's overhead, hence this small reader.
    """

    service: InferenceService

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls
        with self.service._connections_lock:
            self.service._connections.add(self.connection)

    def finish(self) -> None:
        with self.service._connections_lock:
            self.service._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def handle(self) -> None:
        while True:
            try:
                head = self._read_head()
            except _BadHead as err:
                self.service.metrics.error("bad-request")
                self.service.metrics.requests.inc("-", str(err.status))
                body = json.dumps({"error": {"kind": "bad-request", "message": err.message}}).encode()
                with contextlib.suppress(OSError):
                    self._send(err.status, body, JSON, close=True)
                return
            except (OSError, ValueError):  # timeout, reset, or a closed connection
                return
            if head is None:
                return
            try:
                keep = self._dispatch(head) and head.keep_alive
            except OSError:
                return
            if not keep:
                return

    def _read_head(self) -> _Head | None:
        line = self.rfile.readline(_MAX_LINE + 1)
        while line in (b"\r\n", b"\n"):  # RFC 9112: ignore empty lines before a request line
            line = self.rfile.readline(_MAX_LINE + 1)
        if not line:
            return None
        if len(line) > _MAX_LINE:
            raise _BadHead(414, "request line too long")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[1].startswith("/"):
            raise _BadHead(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadHead(505, f"{version} is not supported; use HTTP/1.1")
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                raise _BadHead(431, "header line too long")
            if line in (b"\r\n", b"\n", b""):
                return _Head(method, target.split("?", 1)[0], version, headers)
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():
                raise _BadHead(400, "malformed header line")
            headers[name.lower()] = value.strip()
        raise _BadHead(431, f"more than {_MAX_HEADERS} headers")

    # --- routing; returns whether the connection may be reused
    def _dispatch(self, head: _Head) -> bool:
        if head.method == "POST":
            return self._post(head)
        if head.method != "GET":
            reusable = self._discard_body(head)
            self._error(RequestError(405, "bad-request", f"method {head.method} not allowed"), allow="GET, POST",
                        close=not reusable)  # fmt: skip
            return reusable
        service, path = self.service, head.path
        if path == "/metrics":
            self._send(200, service.metrics.exposition().encode(), METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            models = service.models()
            self._json(200, {"status": "ok" if models else "no-model", "models": sorted(models)})
        elif path == "/v1/models":
            self._json(200, {"models": [service.describe(m) for _, m in sorted(service.models().items())]})
        elif match := _MODEL.match(path):
            model = service.models().get(match.group(1))
            if model is None:
                self._error(RequestError(404, "not-found", f"no model named {match.group(1)!r} is served here"))
            else:
                self._json(200, service.describe(model))
        elif _INFER.match(path):
            self._error(RequestError(405, "bad-request", "use POST for inference"), allow="POST")
        else:
            self._error(RequestError(404, "not-found", f"no such endpoint {path}"))
        return True

    def _post(self, head: _Head) -> bool:
        match = _INFER.match(head.path)
        if match is None:
            reusable = self._discard_body(head)
            self._error(
                RequestError(404, "not-found", f"no such endpoint {head.path} (POST /v1/models/NAME/infer)"),
                close=not reusable,
            )
            return reusable
        name = match.group(1)
        try:
            body = self._read_body(head)
        except RequestError as err:
            self._error(err, model=name, close=True)  # the body was not read: the connection is unusable
            return False
        try:
            payload, kind, headers = self.service.infer(
                name, body, head.headers.get("content-type", JSON), head.headers.get("accept", "")
            )
        except RequestError as err:
            self._error(err, model=name)
            return True
        self.service.metrics.requests.inc(name, "200")
        self._send(200, payload, kind, headers)
        return True

    # --- bodies and answers
    def _read_body(self, head: _Head) -> bytes:
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            raise RequestError(411, "bad-request", "chunked bodies are not accepted; send Content-Length")
        length_text = head.headers.get("content-length")
        if length_text is None:
            raise RequestError(411, "bad-request", "Content-Length is required")
        if not length_text.isdigit():
            raise RequestError(400, "bad-request", f"Content-Length {length_text!r} is not a number")
        length, limit = int(length_text), self.service.config.max_body_bytes
        if length > limit:
            raise RequestError(413, "too-large", f"request body of {length} bytes exceeds the limit of {limit} bytes")
        body = self.rfile.read(length)
        if len(body) != length:
            raise RequestError(400, "bad-request", f"body ended after {len(body)} of {length} bytes")
        return body

    def _discard_body(self, head: _Head) -> bool:
        """Skip a body we do not use; False when it cannot be skipped (the connection must close)."""
        length_text = head.headers.get("content-length", "0")
        if "transfer-encoding" in head.headers or not length_text.isdigit():
            return False
        length = int(length_text)
        if length > self.service.config.max_body_bytes:
            return False
        return len(self.rfile.read(length)) == length

    def _json(self, status: int, document: Any) -> None:
        self._send(status, json.dumps(document).encode(), JSON)

    def _error(self, err: RequestError, *, model: str = "-", allow: str | None = None, close: bool = False) -> None:
        metrics = self.service.metrics
        metrics.error(err.kind)
        metrics.requests.inc(model, str(err.status))
        headers = {"Allow": allow} if allow else {}
        if err.status == 503:
            headers["Retry-After"] = "1"
        body = json.dumps({"error": {"kind": err.kind, "message": err.message}}).encode()
        self._send(err.status, body, JSON, headers, close=close)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        close: bool = False,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Date: {_http_date()}",
            "Server: edgefleet-agent",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{key}: {value}" for key, value in (headers or {}).items())
        if close:
            lines.append("Connection: close")
        self.connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)  # one write


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _TCPServer6(_TCPServer):
    address_family = socket.AF_INET6


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False


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
