"""The local inference API for applications on the device: HTTP on 127.0.0.1 or on a Unix socket.

The Open Inference Protocol v2 (KServe, Triton) is the primary API (agent/api/oip_routes.py); the older /v1
API stays for applications written against it (agent/api/routes.py). This module holds what both share:
the models served, admission, the model run and its accounting, feedback.

Admission: a request for a model is admitted (or refused with 404 or 503) from its head alone, before its
body is read. At most `concurrency` requests run inference at once and at most `queue_size` more wait; the
rest are refused with 503 at once. A real-time slot's request takes no inference place: the compute gate starts it
at once and holds the other classes back while it runs (`_real_time`). Connections are served by one I/O thread
and a fixed pool of workers (agent/api/http/server.py), with deadlines for the head, the body and the answer.

Accounting: every answer but 200 is counted by kind. Refusals (bad input, unknown model, too large, full)
are the caller's fault: they never reach the model's health. Only a failure of the model's own run on
input that passed every check is a model failure: it calls `on_failure`, which health and telemetry read.

`swap(model, slot=...)` replaces a slot's model atomically: requests already holding the old model finish on it;
`wait_idle(old)` says when the old one is no longer used. A device serves one model per slot (several at once); a
model is addressed by its model name, or by its slot's name (`lookup`). `repository` (set by the daemon) adds what
the repository index says of slots not serving (installing, refused, with the reason). Nothing is unpickled.

Generative models are served by the generation endpoints (agent/api/generation/), bounded by their own gate
(`GenerationParts`, shared with MQTT): each admitted generation holds a worker while it runs or waits, so the pool
has `workers` (default `concurrency + 2`) for everything else plus one per generation the gate admits.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np

from edgefleet.agent.api.body_guard import load_json
from edgefleet.agent.api.callers import Callers
from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.error_log import SampledLog
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.runner import GenerationParts
from edgefleet.agent.api.http.protocol import ServerLimits, listen_tcp, listen_unix
from edgefleet.agent.api.http.server import HttpServer
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.api.metrics.page import MetricsPage
from edgefleet.agent.api.routes import Routes
from edgefleet.agent.api.served import ServedModel
from edgefleet.agent.quality import FeedbackError, FieldAccuracy, parse_labels
from edgefleet.agent.schedule.batcher import Batcher, batch_support
from edgefleet.agent.schedule.gate import ComputeGate
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import DataError

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


QUICK_MS = 1.0  # a model whose last run took less may be answered on the server's I/O thread (Ticket.quick)


class Ticket:
    """An admitted inference request: holds its place in the queue and the model it will run on."""

    def __init__(self, service: InferenceService, model: ServedModel) -> None:
        self.service, self.model, self.admitted = service, model, time.monotonic()
        self._released = False
        self.slot = False  # an inference place taken for it by `quick`, not yet handed to `run`

    def quick(self) -> bool:
        """Whether the request may run on the server's I/O thread: nothing else is admitted, its model's last run
        took under QUICK_MS, and an inference place is free now (taken for it, so that `run` never waits)."""
        return self.service._quick(self)

    def release(self) -> None:
        if self.slot:  # reserved by `quick`, never run (the body was refused)
            self.slot = False
            self.service._slots.release()
        if not self._released:
            self._released = True
            self.service._leave(self.model)

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run the model (InferenceService.run): (outputs, latency ms)."""
        return self.service.run(self, feeds)

    def remember(
        self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray], client_id: str | None = None
    ) -> str:
        """The request id an application quotes in its feedback (InferenceService.remember)."""
        return self.service.remember(self, feeds, outputs, client_id)


class InferenceService:
    """The HTTP server, the models it serves and its metrics. `start()` returns at once; `stop()` drains."""

    def __init__(
        self,
        models: Iterable[ServedModel] = (),
        config: ServiceConfig | None = None,
        metrics: ServiceMetrics | None = None,
        on_answer: Callable[[float], None] | None = None,
        on_failure: Callable[[], None] | None = None,
        generation: GenerationParts | None = None,
        on_model_answer: Callable[[str, float], None] | None = None,
        on_model_failure: Callable[[str], None] | None = None,
        compute: ComputeGate | None = None,
    ) -> None:
        """`on_answer(latency_ms)` / `on_failure()`: a request answered / the model's own run failed (and the same
        with the model's name first: `on_model_answer`, `on_model_failure`, the daemon's per-slot accounting).
        `generation`: the limits, gate and accounting of generations (the daemon's, shared with MQTT; else the
        service's own). `compute`: the scheduler's compute gate (agent/schedule/gate.py): each run, batch and
        generated token is a step of its model's slot, of the class the gate assigns that slot; None runs freely."""
        self.config = config or ServiceConfig()
        self.compute = compute
        self._generation = (generation or GenerationParts.standalone()).with_compute(compute)
        self._on_answer, self._on_failure = on_answer, on_failure
        self._on_model_answer, self._on_model_failure = on_model_answer, on_model_failure
        if self.config.unix_socket is None and not _is_loopback(self.config.host) and not self.config.api_token:
            raise ValueError(
                f"the inference API binds {self.config.host} (beyond loopback) only with a token (--api-token-file)"
            )
        self.field = FieldAccuracy()
        self._client_ids: OrderedDict[tuple[str, str], str] = OrderedDict()  # (model, OIP id) -> field id
        self.metrics = metrics or ServiceMetrics()
        self._page: MetricsPage | None = None
        self._models: dict[str, ServedModel] = {m.manifest.model_name: m for m in models}
        self._slots_of: dict[str, str] = {}  # slot -> the model name it serves
        self._models_lock = threading.Lock()
        # (slot, model name or None, state, reason) of the device's slots that serve nothing now (the daemon's)
        self.repository: Callable[[], list[tuple[str, str | None, str, str]]] = lambda: []
        self._slots = threading.BoundedSemaphore(self.config.concurrency)
        self._count_lock = threading.Condition()
        self._pending = 0  # admitted: waiting or running
        self._last_ms: dict[int, float] = {}  # id(model) -> its last run's latency (Ticket.quick)
        self._running = 0
        self._using: dict[int, int] = {}  # id(model) -> requests using it
        self._server: HttpServer | None = None
        self._batchers: dict[int, Batcher] = {}  # id(model) -> its batcher (config.batching; batchable models)
        self._batching: dict[str, str] = {}  # model name -> whether and how it is batched, or why not
        self._retired: set[int] = set()  # id(model) of models replaced: their batcher closes once unused
        for model in self._models.values():
            self._start_batching(model)
        self._errors = SampledLog(log)  # a model failing on every request writes a traceback a minute, not each
        self.metrics.queue_depth = lambda: max(0, self._pending - self._running)
        self.metrics.in_flight = lambda: self._running
        self.metrics.open_connections = lambda: self._server.open_connections() if self._server else 0
        self.metrics.models = lambda: [(n, m.bundle_id, m.provider) for n, m in sorted(self._models.items())]
        self.metrics.slot_of = self.slot_of
        self.metrics.field_accuracy = lambda: [
            (n, score.accuracy, score.samples)
            for n in sorted(self._models)
            if (score := self.field.score(n)).accuracy is not None
        ]

    @property
    def generation(self) -> GenerationParts:
        return self._generation

    def render_metrics(self, accept: str = "") -> tuple[bytes, str]:
        """The /metrics page (agent/api/metrics/page.py, imported with this module: about 20 KiB; imported at the first
        scrape instead, on a worker thread, it cost that thread's malloc arena about 0.5 MB for good)."""
        if self._page is None:
            self._page = MetricsPage(self.metrics, self._generation.accounting.metrics)
        return self._page.render(accept)

    # --- models
    def models(self) -> dict[str, ServedModel]:
        return dict(self._models)

    def lookup(self, name: str) -> ServedModel | None:
        """The model served under `name`: a model name, or a slot's name."""
        models = self._models
        found = models.get(name)
        if found is None and name in self._slots_of:
            found = models.get(self._slots_of[name])
        return found

    def slot_of(self, model_name: str) -> str:
        """The slot `model_name` is served in ("default" when none says)."""
        return next((s for s, n in self._slots_of.items() if n == model_name), "default")

    def swap(self, model: ServedModel, replaces: str | None = None, slot: str | None = None) -> ServedModel | None:
        """Serve `model` under its name from now on (in `slot`, replacing what that slot served, or `replaces`);
        returns the model it replaced."""
        name = model.manifest.model_name
        with self._models_lock:
            models = dict(self._models)
            old = models.get(name)
            if slot is not None and slot in self._slots_of:
                replaces = replaces or self._slots_of[slot]
            if replaces and replaces != name:
                old = models.pop(replaces, None) or old
            models[name] = model
            if slot is not None:
                self._slots_of = {**self._slots_of, slot: name}
            self._models = models  # one reference assignment: readers see the old dict or the new one
        self._start_batching(model)
        if old is not None and old is not model:
            self._retire(old)
        self.metrics.swaps.inc(name)
        log.info("serving %s from bundle %s on %s", name, model.bundle_id, model.provider)
        return old

    def remove(self, name: str) -> ServedModel | None:
        """Stop serving the model `name` (a model or a slot name); returns it."""
        with self._models_lock:
            models = dict(self._models)
            name = self._slots_of.get(name, name)
            old = models.pop(name, None)
            self._slots_of = {s: n for s, n in self._slots_of.items() if n != name}
            self._models = models
        if old is not None:
            self._retire(old)
        return old

    # --- dynamic batching (agent/schedule/batcher.py)
    def _start_batching(self, model: ServedModel) -> None:
        config, name = self.config.batching, model.manifest.model_name
        if config is None:
            self._batching[name] = "off (no batching configured)"
            return
        support = batch_support(model.manifest)
        check, run_checked = getattr(model, "check", None), getattr(model, "run_checked", None)
        if support.batchable and (check is None or run_checked is None):
            support = type(support)(False, "this model cannot check a request apart from running it")
        self._batching[name] = support.reason if support.batchable else f"not batched: {support.reason}"
        log.info("%s (%s): %s", name, model.bundle_id, self._batching[name])
        if support.batchable and id(model) not in self._batchers:
            gate = None if self.compute is None else partial(self.compute.step, name)
            self._batchers[id(model)] = Batcher(run_checked, config, name=name, gate=gate)  # type: ignore[arg-type]

    def _retire(self, model: ServedModel) -> None:
        """A replaced model's batcher closes once no admitted request uses the model any more."""
        with self._count_lock:
            if id(model) not in self._batchers:
                return
            if self._using.get(id(model), 0):
                self._retired.add(id(model))
                return
            batcher = self._batchers.pop(id(model))
        batcher.close()

    def batching(self, model: ServedModel) -> dict[str, Any]:
        """Whether `model` is batched, with what settings, and its batches so far (describe, bench/batching.py)."""
        batcher = self._batchers.get(id(model))
        reason = self._batching.get(model.manifest.model_name, "off")
        if batcher is None:
            return {"enabled": False, "reason": reason}
        total = batcher.timer.total()
        return {
            "enabled": batcher.reason is None,
            "reason": batcher.reason or reason,
            **batcher.config.model_dump(),
            "batches": total.batches,
            "requests": total.batched_requests,
        }

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
        return int(self._server.listener.getsockname()[1])

    def start(self) -> InferenceService:
        config = self.config
        if config.unix_socket is not None:
            path = config.unix_socket
            if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                path.unlink()  # left by an earlier agent; binding would fail
            listener = listen_unix(str(path))
            os.chmod(path, config.socket_mode)
        else:
            listener = listen_tcp(config.host, config.port)
        generations = self._generation.config.capacity  # each holds a worker while it runs or waits
        limits = ServerLimits(
            max_connections=config.max_connections, max_body_bytes=config.max_body_bytes,
            header_timeout_s=config.header_timeout_s, body_timeout_s=config.body_timeout_s,
            send_timeout_s=config.send_timeout_s, keep_alive_s=config.keep_alive_s,
            workers=(config.workers or config.concurrency + 2) + generations,
        )  # fmt: skip
        port = config.port if config.unix_socket is not None else int(listener.getsockname()[1])
        routes = Routes(self, self._generation, Callers(config, port))
        self._server = HttpServer(listener, routes, limits, on_close=self.metrics.closed.inc).start()
        log.info("inference API on %s", self.address)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let running requests finish (up to `grace_s`), then close every connection."""
        if self._server is None:
            return
        with self._count_lock:
            deadline = time.monotonic() + grace_s
            while self._pending and time.monotonic() < deadline:
                self._count_lock.wait(0.05)
        self._server.stop()
        for batcher in list(self._batchers.values()):
            batcher.close()
        if self.config.unix_socket is not None:
            self.config.unix_socket.unlink(missing_ok=True)
        self._server = None

    def __enter__(self) -> InferenceService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- admission and the model run
    def admit(self, name: str, version: str | None = None) -> Ticket:
        """Take a place for a request to `name` (a model or slot name) before its body is read; 404 or 503 when
        there is none."""
        model = self.lookup(name)
        if model is None:
            served = ", ".join(sorted(self._models)) or "none"
            raise RequestError(404, "not-found", f"no model named {name!r} is served here (serving: {served})")
        if version is not None and version != model.manifest.model_version:
            raise RequestError(404, "not-found", f"model {name!r} has no version {version!r} here "
                               f"(serving version {model.manifest.model_version!r})")  # fmt: skip
        with self._count_lock:
            if self._pending >= self.config.concurrency + self.config.queue_size:
                raise RequestError(503, "overloaded", f"queue full ({self.config.queue_size} waiting); retry later")
            self._pending += 1
            self._using[id(model)] = self._using.get(id(model), 0) + 1
        return Ticket(self, model)

    def _quick(self, ticket: Ticket) -> bool:
        if id(ticket.model) in self._batchers:  # a batched request waits for its batch on a worker, never here
            return False
        if self._last_ms.get(id(ticket.model), QUICK_MS) >= QUICK_MS or self._pending != 1:
            return False
        if not self._slots.acquire(blocking=False):
            return False
        ticket.slot = True
        return True

    def _leave(self, model: ServedModel) -> None:
        with self._count_lock:
            self._pending -= 1
            left = self._using[id(model)] - 1
            if left:
                self._using[id(model)] = left
            else:
                del self._using[id(model)]
            self._count_lock.notify_all()
            retired = None
            if not left and id(model) in self._retired:
                self._retired.discard(id(model))
                retired = self._batchers.pop(id(model))
        if retired is not None:
            retired.close()

    def _real_time(self, model: ServedModel) -> bool:
        """A real-time slot's request takes no inference place: behind a burst of batch requests holding every
        place it would wait for them all before its class counts. The compute gate orders it instead (it starts at
        once; the other classes wait while it runs or waits), and admission still bounds what is pending."""
        return self.compute is not None and self.compute.class_of(model.manifest.model_name) == "real-time"

    def run(self, ticket: Ticket, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run the admitted request's model: (outputs, latency ms). Input the model refuses is a 400; only an
        exception from the run itself is a model failure (a 500, counted against the model's health)."""
        model = ticket.model
        batcher = self._batchers.get(id(model))
        if batcher is not None:
            return self._run_batched(model, batcher, feeds)
        held = ticket.slot  # a place taken by Ticket.quick: this run owns it now
        ticket.slot = False
        if not held and not self._real_time(model):
            wait = self.config.queue_timeout_s - (time.monotonic() - ticket.admitted)
            if wait <= 0 or not self._slots.acquire(timeout=wait):
                raise RequestError(503, "timeout", f"no inference place within {self.config.queue_timeout_s:g} s")
            held = True
        with self._count_lock:
            self._running += 1
        try:
            start = time.perf_counter()
            if self.compute is None:
                outputs = model.run(feeds)
            else:
                with self.compute.step(model.manifest.model_name):
                    outputs = model.run(feeds)
            latency_ms = (time.perf_counter() - start) * 1000
        except DataError as err:
            raise RequestError(400, "bad-request", str(err)) from err
        except Exception as err:  # the model's own failure: answers this request, counts against its health
            raise self._model_failed(model, err) from err
        finally:
            with self._count_lock:
                self._running -= 1
            if held:
                self._slots.release()
        self._last_ms[id(model)] = latency_ms
        self._model_answered(model, latency_ms)
        return outputs, latency_ms

    def _run_batched(
        self, model: ServedModel, batcher: Batcher, feeds: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], float]:
        """A batched model's run: the request is checked here, then answered from a batch (its latency includes its
        wait for the batch). The batcher's workers bound the runs in flight, not the service's slots."""
        start = time.perf_counter()
        try:
            model.check(feeds)  # type: ignore[attr-defined]
            outputs = batcher.run(feeds)
        except DataError as err:
            raise RequestError(400, "bad-request", str(err)) from err
        except Exception as err:  # the model's own failure: answers this request, counts against its health
            raise self._model_failed(model, err) from err
        latency_ms = (time.perf_counter() - start) * 1000
        self._model_answered(model, latency_ms)
        return outputs, latency_ms

    # --- a run's accounting, the same for a single run and a batch's share
    def _model_answered(self, model: ServedModel, latency_ms: float) -> None:
        self.metrics.observe(model.manifest.model_name, model.bundle_id, model.provider, latency_ms)
        if self._on_answer is not None:
            self._on_answer(latency_ms)
        if self._on_model_answer is not None:
            self._on_model_answer(model.manifest.model_name, latency_ms)

    def _model_failed(self, model: ServedModel, err: Exception) -> RequestError:
        """Count the model's own failure (its health and its slot's) and the 500 that answers it."""
        self._errors.exception("inference", "inference failed on %s", model.bundle_id)
        self.metrics.failure(model.manifest.model_name)
        if self._on_failure is not None:
            self._on_failure()
        if self._on_model_failure is not None:
            self._on_model_failure(model.manifest.model_name)
        return RequestError(500, "runtime", f"inference failed: {type(err).__name__}: {err}")

    def remember(
        self, ticket: Ticket, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray], client_id: str | None = None
    ) -> str:
        """The request id an application quotes in its feedback (an OIP `id` maps to it too); the inputs and
        outputs go to the field-accuracy observers (drift)."""
        model = ticket.model
        name = model.manifest.model_name
        request_id = self.field.remember(name, outputs, bundle_id=model.bundle_id, inputs=feeds)
        if client_id:
            with self._models_lock:
                self._client_ids[(name, client_id)] = request_id
                while len(self._client_ids) > 10_000:
                    self._client_ids.popitem(last=False)
        return request_id

    def feedback(self, name: str, body: bytes) -> dict[str, Any]:
        """{"request_id" (or the OIP "id"): ..., "label": N}: the true class of an earlier answer."""
        document = load_json(body)
        quoted = document.get("request_id", document.get("id")) if isinstance(document, dict) else None
        label = document.get("label") if isinstance(document, dict) else None
        if not isinstance(quoted, str) or label is None:
            raise RequestError(400, "bad-request", 'feedback must be JSON {"request_id": "...", "label": N}')
        try:
            labels = parse_labels(label)  # one class index, or one per sample of the request
        except FeedbackError as err:
            raise RequestError(400, "bad-request", str(err)) from err
        with self._models_lock:
            request_id = self._client_ids.pop((name, quoted), quoted)
        try:
            correct = self.field.feedback(name, request_id, labels)
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
            "golden": None
            if golden is None
            else {"passed": golden.passed, "rule": golden.rule, "reason": golden.reason},
            "batching": self.batching(model),
            "inputs": [spec.model_dump() for spec in manifest.inputs],
            "outputs": [spec.model_dump() for spec in manifest.outputs],
            **_generation(manifest, self._generation.config.max_tokens),
        }


def _generation(manifest: Manifest, cap: int) -> dict[str, Any]:
    """A generative model's limits, as its clients need them."""
    spec = manifest.generation
    if spec is None:
        return {}
    return {"generation": {
        "runtime": spec.runtime, "context_length": spec.context_length, "default_max_tokens": spec.max_new_tokens,
        "max_tokens": min(cap, spec.context_length - 1), "eos_token_ids": list(spec.eos_token_ids),
        "endpoints": [f"/v2/models/{manifest.model_name}/generate", f"/v2/models/{manifest.model_name}/generate_stream",
                      "/v1/completions", "/v1/chat/completions"],
    }}  # fmt: skip


__all__ = ["InferenceService", "RequestError", "ServedModel", "ServiceConfig", "Ticket"]
