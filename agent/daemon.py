"""The agent daemon: start-up, MQTT wiring, the worker threads and their supervision, the hot swap.

paho's network thread only decodes and enqueues; installs and inference run on their own threads so
a long download never blocks inference and a bad message never reaches the runtime unchecked. The
workers are mixins, one file each: installs (install_worker.py), health and rollback (health_watch.py),
inference over MQTT (mqtt_inference.py), status, events and telemetry (reporting.py).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

from edgefleet import __version__
from edgefleet.agent import installer, watchdog
from edgefleet.agent.benchmark import BenchmarkService
from edgefleet.agent.config import AgentConfig
from edgefleet.agent.desired_state import DesiredState
from edgefleet.agent.feedback import FeedbackError
from edgefleet.agent.health_watch import HealthWatch
from edgefleet.agent.install_worker import InstallWorker
from edgefleet.agent.link_pacing import LinkPacer
from edgefleet.agent.mqtt_inference import MqttInference
from edgefleet.agent.quality import Quality
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions
from edgefleet.agent.service import InferenceService, ServiceConfig
from edgefleet.agent.spool import Spool
from edgefleet.agent.store import Store
from edgefleet.agent.telemetry import RequestStats, ResourceSampler
from edgefleet.agent.trust import DeviceTrust
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceState, DeviceStatus, MessageError
from edgefleet.core.mqtt import Connection, Will
from edgefleet.core.profiles import device_profiles
from edgefleet.core.signing import TrustedKeys
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)


class Agent(InstallWorker, HealthWatch, MqttInference):
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.topics = Topics(config.prefix)
        self.store = Store(config.state_dir, keep_previous=config.keep_previous)
        self.trust = DeviceTrust(TrustedKeys.load(config.trusted_paths), self.store, config.keyset)
        self.desired = DesiredState(config.device_id, config.groups, self.trust, self.store)
        self._stale: str | None = None
        # The most specific profile names this device; it also runs bundles for the profiles it refines.
        self.profiles = device_profiles(config.profile)
        self.profile = self.profiles[0]
        self.model: LoadedModel | None = None
        self.service: InferenceService | None = None
        self.runtime = RuntimeOptions(config.threads, config.state_dir / "cache", config.selection)
        self.state: DeviceState = "starting"
        self.last_error: str | None = None
        self.stats = RequestStats()
        self.quality = Quality(config.quality, self.stats, lambda: self.model)  # drift, shadow, probes, feedback
        self.resources = ResourceSampler()
        self.spool = Spool(config.state_dir / "outbox.sqlite", config.spool_max_records)
        self._spool_ready = threading.Event()
        self._inference_beat = time.monotonic()
        self._work: queue.Queue[str] = queue.Queue()
        self._requests: queue.Queue[bytes] = queue.Queue(maxsize=256)
        self._stop = threading.Event()
        self._status_lock = threading.Lock()
        self.link = LinkPacer(config.max_bytes_per_s)  # the cap; reports before bundle chunks
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
            observer=self.link,
        )

    # --- lifecycle
    def run(self) -> None:
        """Serve until `stop()`; the broker may come and go meanwhile."""
        removed = self.store.clean_incomplete()
        if removed:
            log.info("removed incomplete installs left by a crash: %s", ", ".join(removed))
        self._restore()
        self.quality.bind(self.model)
        if self.config.http is not None:
            self._start_service(self.config.http)
        cid = self.config.device_id
        self.conn.subscribe(self.topics.device_desired(cid), self._on_device_desired)
        for group in self.config.groups:
            self.conn.subscribe(self.topics.group_desired(group), self._on_group_desired)
        self.conn.subscribe(self.topics.infer_request(cid), self._on_infer_request, qos=0)
        self.conn.subscribe(self.topics.infer_feedback(cid), self._on_infer_feedback, qos=0)
        benchmark = BenchmarkService(
            self.conn, self.topics, cid, [p.name for p in self.profiles], self.config.threads, self.config.selection,
            lambda bundle_id, folder: installer.fetch_candidate(self._install_context(), bundle_id, folder),
            self.config.state_dir / "benchmark", self.config.benchmark_max_cpu_share,
        ).start()  # fmt: skip
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
        self.quality.start()
        # Ready once serving locally: waiting for the broker would turn a broker outage into a restart loop.
        watchdog.ready(self.state)
        self._supervise(threads)
        watchdog.stopping()
        benchmark.stop()
        self.quality.stop()
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
            self.service.field = self.quality.field  # one field-accuracy record (and quality observers) for every path
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

    # --- MQTT callbacks (network thread: decode and enqueue only)
    def _on_connected(self) -> None:
        self._publish_status()
        self._spool_ready.set()
        self._work.put("reconcile")

    def _on_device_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        self._on_desired(topic, payload, None)

    def _on_group_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        self._on_desired(topic, payload, topic.split("/")[-2])

    def _on_infer_feedback(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            self.quality.feedback(payload)
        except (MessageError, FeedbackError) as err:
            log.warning("refused feedback on %s: %s", topic, err)

    # --- install worker (the rest, with the shadow install, is in agent/install_worker.py)
    def _swap(self, model: LoadedModel) -> LoadedModel | None:
        """Hot swap: the old model serves until this call; requests in flight on it finish, then it closes."""
        previous, self.model = self.model, model
        self.stats.reset_health()
        self.quality.bind(model)
        if self.service is not None:
            self.service.swap(model, replaces=previous.manifest.model_name if previous else None)
        if previous is not None:
            threading.Thread(target=self._retire, args=(previous,), name="retire", daemon=True).start()
        return previous

    def _retire(self, model: LoadedModel) -> None:
        if self.service is None or self.service.wait_idle(model, 30):
            model.close()


__all__ = ["Agent"]
