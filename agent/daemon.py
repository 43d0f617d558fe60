"""The agent daemon: MQTT wiring, the install worker, the inference worker and the telemetry loop.

paho's network thread only decodes and enqueues; installs and inference run on their own threads so
a long download never blocks inference and a bad message never reaches the runtime unchecked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import queue
import socket
import threading
import time

import onnxruntime as ort
import psutil

from edgefleet import __version__
from edgefleet.agent import watchdog
from edgefleet.agent.config import AgentConfig
from edgefleet.agent.feedback import FieldScore
from edgefleet.agent.health import HealthVerdict, judge_health
from edgefleet.agent.installer import InstallContext, Refused, install, load_installed
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions
from edgefleet.agent.service import InferenceService, ServiceConfig
from edgefleet.agent.spool import Spool
from edgefleet.agent.store import Store
from edgefleet.agent.telemetry import RequestStats, ResourceSampler
from edgefleet.agent.transfer import TransferError
from edgefleet.core.bundle import verify_files
from edgefleet.core.errors import BrokerError, BundleError, DataError, EdgefleetError
from edgefleet.core.messages import (
    Desired,
    DeviceState,
    DeviceStatus,
    Event,
    EventKind,
    Hardware,
    InferRequest,
    InferResponse,
    MessageError,
    Telemetry,
    WireTensor,
    decode,
)
from edgefleet.core.mqtt import Connection, Will
from edgefleet.core.profiles import detect_profile, get_profile
from edgefleet.core.signing import TrustedKeys
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.topics = Topics(config.prefix)
        self.store = Store(config.state_dir, keep_previous=config.keep_previous)
        self.trusted = TrustedKeys.load(config.trusted_paths)
        self.profile = detect_profile() if config.profile == "auto" else get_profile(config.profile)
        self.model: LoadedModel | None = None
        self.service: InferenceService | None = None
        self.runtime = RuntimeOptions(config.threads, config.state_dir / "cache", config.selection)
        self.state: DeviceState = "starting"
        self.last_error: str | None = None
        self.stats = RequestStats()
        self.resources = ResourceSampler()
        self._device_desired: Desired | None = None
        self._group_desired: dict[str, Desired] = {}
        self.spool = Spool(config.state_dir / "outbox.sqlite", config.spool_max_records)
        self._spool_ready = threading.Event()
        self._inference_beat = time.monotonic()
        self._work: queue.Queue[str] = queue.Queue()
        self._requests: queue.Queue[bytes] = queue.Queue(maxsize=256)
        self._stop = threading.Event()
        self._status_lock = threading.Lock()
        offline = DeviceStatus(
            device_id=config.device_id,
            online=False,
            state="offline",
            agent_version=__version__,
            profile=self.profile.name,
            groups=config.groups,
        )
        self.conn = Connection(
            config.broker,
            f"edgefleet-agent-{config.device_id}",
            protocol=config.protocol,
            will=Will(self.topics.status(config.device_id), offline.encode()),
            tls=config.tls,
            on_connected=self._on_connected,
        )

    # --- lifecycle
    def run(self) -> None:
        """Serve until `stop()`; the broker may come and go meanwhile."""
        removed = self.store.clean_incomplete()
        if removed:
            log.info("removed incomplete installs left by a crash: %s", ", ".join(removed))
        self._restore()
        if self.config.http is not None:
            self._start_service(self.config.http)
        cid = self.config.device_id
        self.conn.subscribe(self.topics.device_desired(cid), self._on_device_desired)
        for group in self.config.groups:
            self.conn.subscribe(self.topics.group_desired(group), self._on_group_desired)
        self.conn.subscribe(self.topics.infer_request(cid), self._on_infer_request, qos=0)
        self.conn.start(wait=None)
        threads = [
            threading.Thread(target=self._install_loop, name="install", daemon=True),
            threading.Thread(target=self._inference_loop, name="inference", daemon=True),
            threading.Thread(target=self._telemetry_loop, name="telemetry", daemon=True),
            threading.Thread(target=self._flush_loop, name="spool-flush", daemon=True),
            threading.Thread(target=self._health_loop, name="health", daemon=True),
        ]
        for thread in threads:
            thread.start()
        # Ready once serving locally: waiting for the broker would turn a broker outage into a restart loop.
        watchdog.ready(self.state)
        self._supervise(threads)
        watchdog.stopping()
        if self.service is not None:
            self.service.stop()
        if self.conn.connected:
            with contextlib.suppress(BrokerError):  # going down anyway; the last will covers us
                self._publish_status(online=False, state="offline", wait=2.0)
        self.conn.stop()
        self.spool.close()

    def _start_service(self, config: ServiceConfig) -> None:
        """The local API is a convenience: if its port is taken the agent still installs and serves over MQTT."""
        try:
            self.service = InferenceService(
                [self.model] if self.model else [], config, on_answer=self.stats.record,
                on_failure=self.stats.record_failure,
            ).start()  # fmt: skip
        except OSError as err:
            self.last_error = f"local inference API not started: {err}"
            log.error("%s", self.last_error)
            return
        log.info("local inference API on %s", self.service.address)

    def _supervise(self, threads: list[threading.Thread]) -> None:
        """Until stopped: ping systemd's watchdog while every worker is alive and inference keeps turning."""
        limit = watchdog.watchdog_interval()
        while not self._stop.wait(limit / 2 if limit else 5.0):
            dead = [t.name for t in threads if not t.is_alive()]
            stuck = time.monotonic() - self._inference_beat > 10
            if dead or stuck:
                log.error("not pinging the watchdog: dead threads %s, inference stuck %s", dead, stuck)
                continue
            watchdog.ping()

    def stop(self) -> None:
        self._stop.set()
        self._spool_ready.set()
        self._work.put("stop")

    def _restore(self) -> None:
        """Start on the last committed bundle, falling back to older ones if it no longer checks out."""
        state = self.store.load_state()
        for bundle_id in [b for b in [state.committed, *state.history] if b]:
            try:
                self.model = load_installed(self.store, bundle_id, self.trusted, self.runtime)
            except EdgefleetError as err:
                log.error("installed bundle %s does not check out: %s", bundle_id, err)
                self.last_error = f"{bundle_id}: {err}"
                continue
            if bundle_id != state.committed:
                self.store.commit(bundle_id, self.model.manifest.model_name, self.model.manifest.model_version)
            log.info("serving committed bundle %s on %s", bundle_id, self.model.provider)
            self.state = "serving"
            return
        self.state = "idle"

    # --- MQTT callbacks (network thread: decode and enqueue only)
    def _on_connected(self) -> None:
        self._publish_status()
        self._spool_ready.set()
        self._work.put("reconcile")

    def _on_device_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        if not payload:  # a cleared retained message
            self._device_desired = None
            return
        try:
            self._device_desired = decode(Desired, payload)
        except MessageError as err:
            self._refuse_message(topic, err)
            return
        self._work.put("reconcile")

    def _on_group_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        group = topic.split("/")[-2]
        if not payload:
            self._group_desired.pop(group, None)
            return
        try:
            self._group_desired[group] = decode(Desired, payload)
        except MessageError as err:
            self._refuse_message(topic, err)
            return
        self._work.put("reconcile")

    def _on_infer_request(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            self._requests.put_nowait(payload)
        except queue.Full:
            self.stats.record_error()
            log.warning("inference queue full; request dropped")

    def _refuse_message(self, topic: str, err: Exception) -> None:
        log.warning("refused message on %s: %s", topic, err)
        self._event("refused", f"message on {topic}: {err}")

    # --- install worker
    def _effective_desired(self) -> Desired | None:
        if self._device_desired is not None:
            return self._device_desired
        for group in self.config.groups:
            if group in self._group_desired:
                return self._group_desired[group]
        return None

    def _install_loop(self) -> None:
        while not self._stop.is_set():
            item = self._work.get()
            if item == "stop":
                return
            try:
                self._reconcile()
            except Exception as err:  # the daemon must outlive any bug in one install
                log.exception("install worker failed")
                self.last_error = f"internal error: {err}"
                self._publish_status()

    def _reconcile(self) -> None:
        desired = self._effective_desired()
        if desired is None or (self.model is not None and desired.bundle_id == self.model.bundle_id):
            return
        key = f"{desired.bundle_id}@{desired.issued_at}"
        if key in self.store.load_state().refused:
            return
        bundle_id = desired.bundle_id
        self._event("desired", f"{desired.model_name} {desired.model_version} ({bundle_id})", bundle_id=bundle_id)
        self._set_state("downloading")
        ctx = InstallContext(
            self.conn,
            self.topics,
            self.store,
            self.trusted,
            self.profile.name,
            self.runtime,
            self.config.block_window,
            self.config.offer_timeout_s,
            self.config.min_free_bytes,
            int(self.profile.size_limit_mb * 1e6),
        )

        def notify(kind: str, detail: str, progress: float | None) -> None:
            if kind == "downloaded":
                self._set_state("installing")
            self._event(kind, detail, bundle_id=bundle_id, progress=progress)  # type: ignore[arg-type]

        try:
            model = install(ctx, desired, self.store.load_state().versions, notify)
        except (TransferError, BrokerError) as err:
            # Transient: the bundle may appear or the link come back; try again later.
            self._fail(bundle_id, "error", f"{err}; retrying in {self.config.retry_delay_s:g} s")
            self._retry_later()
            return
        except (Refused, BundleError) as err:
            self.store.remember_refusal(key)
            kind: EventKind = "rolled-back" if self.model is not None else "refused"
            self._fail(bundle_id, kind, str(err))
            return
        self.store.commit(bundle_id, model.manifest.model_name, model.manifest.model_version)
        model.bundle_dir = self.store.bundle_dir(bundle_id)
        previous = self._swap(model)
        self.last_error = None
        self._set_state("serving")
        detail = f"now serving on {model.provider}" + (f" (was {previous.bundle_id})" if previous else "")
        self._event("committed", detail, bundle_id=bundle_id)

    def _swap(self, model: LoadedModel) -> LoadedModel | None:
        """Hot swap: the old model serves until this call; requests in flight on it finish, then it closes."""
        previous, self.model = self.model, model
        self.stats.reset_health()
        if self.service is not None:
            self.service.swap(model, replaces=previous.manifest.model_name if previous else None)
        if previous is not None:
            threading.Thread(target=self._retire, args=(previous,), name="retire", daemon=True).start()
        return previous

    def _retire(self, model: LoadedModel) -> None:
        if self.service is None or self.service.wait_idle(model, 30):
            model.close()

    def _fail(self, bundle_id: str, kind: EventKind, reason: str) -> None:
        log.warning("bundle %s: %s", bundle_id, reason)
        self.last_error = f"{bundle_id}: {reason}"
        self._event(kind, reason, bundle_id=bundle_id)
        self._set_state("serving" if self.model is not None else "idle")

    def _retry_later(self) -> None:
        timer = threading.Timer(self.config.retry_delay_s, self._work.put, args=("reconcile",))
        timer.daemon = True
        timer.start()

    # --- inference worker
    def _inference_loop(self) -> None:
        while not self._stop.is_set():
            self._inference_beat = time.monotonic()
            try:
                payload = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                request = decode(InferRequest, payload)
            except MessageError as err:
                self.stats.record_error()
                log.warning("refused inference request: %s", err)
                continue
            response = self._infer(request)
            try:
                self.conn.publish(
                    self.topics.infer_response(self.config.device_id, request.client_id), response.encode(), qos=0
                )
            except (BrokerError, ValueError) as err:
                log.warning("cannot answer request %s: %s", request.request_id, err)

    def _infer(self, request: InferRequest) -> InferResponse:
        model = self.model
        if model is None:
            self.stats.record_error()
            return InferResponse(request_id=request.request_id, ok=False, error="no model installed")
        try:
            feeds = {name: tensor.to_array() for name, tensor in request.inputs.items()}
            start = time.perf_counter()
            outputs = model.run(feeds)
            latency = (time.perf_counter() - start) * 1000
        except (MessageError, DataError) as err:
            self.stats.record_error()
            return InferResponse(request_id=request.request_id, ok=False, error=str(err), bundle_id=model.bundle_id)
        except Exception as err:  # a runtime failure answers the caller instead of killing the worker
            self.stats.record_failure()
            return InferResponse(
                request_id=request.request_id, ok=False, error=f"inference failed: {err}", bundle_id=model.bundle_id
            )
        self.stats.record(latency)
        return InferResponse(
            request_id=request.request_id,
            ok=True,
            latency_ms=round(latency, 4),
            provider=model.provider,
            bundle_id=model.bundle_id,
            outputs={k: WireTensor.of(v) for k, v in outputs.items()},
        )

    # --- telemetry
    def _telemetry_loop(self) -> None:
        while not self._stop.wait(self.config.telemetry_interval_s):
            try:
                self._publish_telemetry()
            except Exception:  # telemetry must never take the agent down
                log.exception("telemetry failed")

    def _publish_telemetry(self) -> None:
        latency, requests, errors, window_s = self.stats.snapshot()
        model = self.model
        golden = model.last_golden if model else None
        field = self.service.field.score() if self.service else FieldScore(None, 0)
        message = Telemetry(
            device_id=self.config.device_id,
            bundle_id=model.bundle_id if model else None,
            provider=model.provider if model else None,
            window_s=round(window_s, 3),
            requests=requests,
            errors=errors,
            throughput_rps=round(requests / window_s, 3) if window_s > 0 else 0.0,
            latency=latency,
            golden_agreement=golden.agreement if golden else None,
            golden_max_abs_error=golden.max_abs_error if golden else None,
            cpu_percent=self.resources.cpu_percent(),
            rss_mb=self.resources.rss_mb(),
            temperature_c=self.resources.temperature_c(),
            queue_depth=self._requests.qsize() + (self.service.metrics.queue_depth() if self.service else 0),
            errors_by_kind={k[0]: int(v) for k, v in self.service.metrics.errors.items()} if self.service else {},
            field_accuracy=field.accuracy,
            field_samples=field.samples,
            spool_depth=self.spool.depth(),
            spool_dropped=self.spool.dropped(),
            seq=self.spool.next_sequence(),
        )
        self._enqueue(self.topics.telemetry(self.config.device_id), message.encode())

    def _enqueue(self, topic: str, payload: bytes) -> None:
        self.spool.put(topic, payload)
        self._spool_ready.set()

    def _flush_loop(self) -> None:
        """Publish spooled reports in order; delete each only once the broker acknowledged it."""
        while not self._stop.is_set():
            self._spool_ready.wait(5.0)
            self._spool_ready.clear()
            while self.conn.connected and not self._stop.is_set():
                batch = self.spool.next_batch()
                if not batch:
                    break
                acked = []
                for record in batch:
                    try:
                        self.conn.publish(record.topic, record.payload, qos=1, wait=10.0)
                    except (BrokerError, ValueError) as err:
                        log.info("spool flush paused: %s", err)
                        break
                    acked.append(record.rowid)
                self.spool.ack(acked)
                if len(acked) < len(batch):
                    self._stop.wait(1.0)  # the link is flaky: back off, then retry in order
                    break

    # --- health after commit
    def _health_loop(self) -> None:
        while not self._stop.wait(self.config.health_interval_s):
            try:
                self._check_health()
            except Exception:  # health checks must never take the agent down
                log.exception("health check failed")

    def _check_health(self) -> None:
        model = self.model
        if model is None:
            return
        try:
            verify_files(model.bundle_dir, model.manifest)
            files_ok, files_reason = True, ""
        except BundleError as err:
            files_ok, files_reason = False, str(err)
        golden = model.check_golden(warmup=0)
        ratio, seen = self.stats.failure_ratio(self.config.failure_window)
        verdict = judge_health(
            files_ok=files_ok,
            files_reason=files_reason,
            golden=golden,
            failure_ratio=ratio,
            requests_seen=seen,
            max_failure_ratio=self.config.max_failure_ratio,
            min_requests=self.config.failure_window,
        )
        if not verdict.healthy:
            self._on_unhealthy(model, verdict)

    def _on_unhealthy(self, model: LoadedModel, verdict: HealthVerdict) -> None:
        bundle_id = model.bundle_id
        self._event("health-failed", verdict.reason, bundle_id=bundle_id)
        self.last_error = f"{bundle_id}: {verdict.reason}"
        if not self.config.rollback_on_failure:
            self._publish_status()
            return
        state = self.store.load_state()
        for previous in state.history:
            try:
                restored = load_installed(self.store, previous, self.trusted, self.runtime)
            except EdgefleetError as err:
                log.warning("previous bundle %s is not usable either: %s", previous, err)
                continue
            desired = self._effective_desired()
            if desired is not None and desired.bundle_id == bundle_id:
                self.store.remember_refusal(f"{desired.bundle_id}@{desired.issued_at}")
            self.store.commit(previous, restored.manifest.model_name, restored.manifest.model_version)
            self._swap(restored)
            self._event("rolled-back", f"{verdict.reason}; now serving {previous}", bundle_id=bundle_id)
            self._publish_status()
            return
        log.error("bundle %s is unhealthy and there is nothing to roll back to", bundle_id)
        self._publish_status()

    # --- status and events
    def _set_state(self, state: DeviceState) -> None:
        self.state = state
        watchdog.status(state)
        self._publish_status()

    def _publish_status(
        self, *, online: bool = True, state: DeviceState | None = None, wait: float | None = None
    ) -> None:
        model = self.model
        status = DeviceStatus(
            device_id=self.config.device_id,
            online=online,
            state=state or self.state,
            agent_version=__version__,
            profile=self.profile.name,
            groups=self.config.groups,
            hardware=_hardware(),
            providers=_usable_providers(model),
            active_bundle=model.bundle_id if model else None,
            active_model=f"{model.manifest.model_name}@{model.manifest.model_version}" if model else None,
            provider_in_use=model.provider if model else None,
            provider_summary=model.choice.summary if model else None,
            providers_not_chosen=dict(model.choice.reasons) if model else {},
            verified=bool(model and model.last_golden and model.last_golden.passed),
            last_error=self.last_error,
        )
        with self._status_lock:
            if self.conn.connected:
                self.conn.publish(
                    self.topics.status(self.config.device_id), status.encode(), qos=1, retain=True, wait=wait
                )

    def _event(
        self, kind: EventKind, detail: str, *, bundle_id: str | None = None, progress: float | None = None
    ) -> None:
        event = Event(
            device_id=self.config.device_id, kind=kind, bundle_id=bundle_id, detail=detail, progress=progress,
            seq=self.spool.next_sequence(),
        )  # fmt: skip
        log.info("event %s %s: %s", kind, bundle_id or "", detail)
        self._enqueue(self.topics.events(self.config.device_id), event.encode())


def _usable_providers(model: LoadedModel | None) -> list[str]:
    """What can run here: from the last provider choice (probing every backend would import them all)."""
    if model is None:
        return list(ort.get_available_providers())
    usable = [p for p, why in model.choice.reasons.items() if not why.startswith(("not available", "excluded"))]
    return [model.provider, *usable]


def _hardware() -> Hardware:
    return Hardware(
        arch=platform.machine(),
        os=platform.system().lower(),
        cpu_count=os.cpu_count() or 1,
        memory_mb=int(psutil.virtual_memory().total / 2**20),
        hostname=socket.gethostname(),
    )


__all__ = ["Agent"]
