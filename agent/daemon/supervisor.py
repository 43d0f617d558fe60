"""The agent daemon: it builds the parts, wires them to MQTT, owns their threads and supervises them.

paho's network thread only decodes and enqueues; installs and inference run on their own threads so a long
download never blocks inference and a bad message never reaches the runtime unchecked. The parts, each with its
dependencies given here and nothing shared behind them:

    Installer       the install worker: signed desired state, installs, commits, rollbacks (agent/install/)
    HealthMonitor   re-checks the served bundle; an unhealthy verdict is a command to the installer
    MqttInference   inference over MQTT (agent/api/mqtt.py); InferenceService is the local HTTP API
    MqttGeneration  generation over MQTT, on workers of its own; it shares `GenerationParts` (one gate bounding
                    generations device-wide, one accounting) with the local API
    Reporter        status, events and telemetry through the disk spool (agent/telemetry/)
    Heartbeat       the freeze check and the telemetry message on a timer (agent/daemon/heartbeat.py)

What the device serves and its state live in one `ServingState`, changed only on the installer's thread; the hot
swap it triggers is `_swapped` here: the new model serves at once, and the old one is closed once its requests are
done; a generative model's streams in flight get `generation.drain_s` to finish before they are cut.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from edgefleet import __version__
from edgefleet.agent.api import (
    GenerationParts,
    InferenceService,
    MqttGeneration,
    MqttInference,
    ServiceConfig,
    ServiceMetrics,
)
from edgefleet.agent.daemon import watchdog
from edgefleet.agent.daemon.config import AgentConfig
from edgefleet.agent.daemon.heartbeat import Heartbeat
from edgefleet.agent.install import (
    DesiredState,
    DeviceTrust,
    HealthMonitor,
    HealthPolicy,
    Identity,
    InstallContext,
    Installer,
    Reconcile,
    ServingState,
    Stop,
    Store,
)
from edgefleet.agent.quality import Quality
from edgefleet.agent.runtime import BenchmarkService, LoadedModel, RuntimeOptions
from edgefleet.agent.telemetry import Reporter, RequestStats, ResourceSampler, Spool
from edgefleet.agent.transfer import LinkPacer
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection, Will
from edgefleet.core.profiles import detect_explained, device_profiles
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import TrustedKeys

log = logging.getLogger(__name__)

STUCK_AFTER_S = 10.0  # the inference loop turns twice a second; silent this long, it is stuck


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        cid = config.device_id
        self.topics = Topics(config.prefix)
        # The most specific profile names this device; it also runs bundles for the profiles it refines.
        if config.profile == "auto":  # the status says why: what matched, what did not, what INT8 lacks here
            profiles, detection = detect_explained()
        else:
            profiles, detection = device_profiles(config.profile), []
        profile = profiles[0]
        self.stats = RequestStats()
        self.link = LinkPacer(config.max_bytes_per_s)  # the cap; reports before bundle chunks
        self.service: InferenceService | None = None
        self._stop = threading.Event()
        offline = DeviceStatus(
            device_id=cid, online=False, state="offline", agent_version=__version__, profile=profile.name,
            groups=config.groups,
        )  # fmt: skip
        self.conn = Connection(
            config.broker,
            f"edgefleet-agent-{cid}",
            protocol=config.protocol,
            will=Will(self.topics.status(cid), offline.encode()),
            tls=config.tls,
            on_connected=self._on_connected,
            observer=self.link,
        )
        store = Store(config.state_dir, keep_previous=config.keep_previous)
        trust = DeviceTrust(TrustedKeys.load(config.trusted_paths), store, config.keyset)
        self.desired = DesiredState(cid, config.groups, trust, store)
        self.reporter = Reporter(
            self.conn, self.topics, cid, Spool(config.state_dir / "outbox.sqlite", config.spool_max_records),
            resend_after_s=config.report_resend_after_s, resend_per_s=config.report_resend_per_s,
        )  # fmt: skip
        identity = Identity(cid, profile.name, tuple(p.name for p in profiles), tuple(config.groups), tuple(detection))
        self.serving = ServingState(identity, self.reporter, self.desired, self._swapped, watchdog.status)
        self.quality = Quality(config.quality, self.stats, lambda: self.serving.model)  # drift, shadow, probes
        self.install_context = InstallContext(
            self.conn, self.topics, store, trust, profile.name,
            RuntimeOptions(config.threads, config.state_dir / "cache", config.selection),
            config.block_window, config.offer_timeout_s, config.min_free_bytes, int(profile.size_limit_mb * 1e6),
            identity.accepts_profiles, self.link,
        )  # fmt: skip
        self.installer = Installer(
            context=self.install_context, desired=self.desired, serving=self.serving, reporter=self.reporter,
            quality=self.quality, link=self.link, retry_delay_s=config.retry_delay_s,
            rollback_on_failure=config.rollback_on_failure,
        )  # fmt: skip
        self.health = HealthMonitor(
            self.serving, self.stats, self.reporter, self.installer.put,
            HealthPolicy(config.health_interval_s, config.max_failure_ratio, config.failure_window),
        )  # fmt: skip
        self.mqtt = MqttInference(self.conn, self.topics, cid, lambda: self.serving.model, self.stats, self.quality)
        self.metrics = ServiceMetrics()  # the local API's, and the model failures of generations over MQTT
        self.generation = GenerationParts.build(config.generation, self.stats, self.metrics)
        self.mqtt_generation = MqttGeneration(self.conn, self.topics, cid, lambda: self.serving.model, self.generation)
        self.heartbeat = Heartbeat(
            interval_s=config.telemetry_interval_s, reporter=self.reporter, serving=self.serving,
            desired=self.desired, stats=self.stats, resources=ResourceSampler(), quality=self.quality,
            link=self.link, mqtt=self.mqtt, service=lambda: self.service,
        )  # fmt: skip

    # --- lifecycle
    def run(self) -> None:
        """Serve until `stop()`; the broker may come and go meanwhile."""
        store = self.install_context.store
        removed = store.clean_incomplete()
        if removed:
            log.info("removed incomplete installs left by a crash: %s", ", ".join(removed))
        self.installer.restore()
        if self.config.http is not None:
            self._start_service(self.config.http)
        cid, installer = self.config.device_id, self.installer
        self.conn.subscribe(self.topics.device_desired(cid), lambda t, p, r: installer.on_desired(t, p, None))
        for group in self.config.groups:
            self.conn.subscribe(self.topics.group_desired(group), self._on_group_desired)
        self.conn.subscribe(self.topics.infer_request(cid), self.mqtt.on_request, qos=0)
        self.conn.subscribe(self.topics.infer_feedback(cid), self.mqtt.on_feedback, qos=0)
        self.conn.subscribe(self.topics.generate_request(cid), self.mqtt_generation.on_request)
        self.conn.subscribe(self.topics.stored(cid), self.reporter.on_stored)  # the control plane stored up to
        benchmark = BenchmarkService(
            self.conn, self.topics, cid, list(self.serving.identity.accepts_profiles), self.config.threads,
            self.config.selection, installer.fetch_candidate, self.config.state_dir / "benchmark",
            self.config.benchmark_max_cpu_share,
        ).start()  # fmt: skip
        self.conn.start(wait=None)
        threads = [
            threading.Thread(target=installer.run, name="install", daemon=True),
            threading.Thread(target=self.mqtt.run, args=(self._stop,), name="inference", daemon=True),
            threading.Thread(target=self.heartbeat.run, args=(self._stop,), name="telemetry", daemon=True),
            threading.Thread(target=self.reporter.run_flush, args=(self._stop,), name="spool-flush", daemon=True),
            threading.Thread(target=self.health.run, args=(self._stop,), name="health", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.quality.start()
        self.mqtt_generation.start()
        # Ready once serving locally: waiting for the broker would turn a broker outage into a restart loop.
        watchdog.ready(self.serving.state)
        self._supervise(threads)
        watchdog.stopping()
        benchmark.stop()
        self.mqtt_generation.stop()
        self.quality.stop()
        if self.service is not None:
            self.service.stop()
        if self.conn.connected:
            with contextlib.suppress(BrokerError):  # going down anyway; the last will covers us
                self.serving.publish_status(online=False, state="offline", wait=2.0)
        self.conn.stop()
        self.reporter.close()

    def stop(self) -> None:
        self._stop.set()
        self.reporter.wake()
        self.installer.put(Stop())

    def _start_service(self, config: ServiceConfig) -> None:
        """The local API is a convenience: if its port is taken the agent still installs and serves over MQTT."""
        model = self.serving.model
        try:
            self.service = InferenceService(
                [model] if model else [], config, metrics=self.metrics, on_answer=self.stats.record,
                on_failure=self.stats.record_failure, generation=self.generation,
            ).start()  # fmt: skip
            self.service.field = self.quality.field  # one field-accuracy record (and quality observers) for every path
        except OSError as err:
            self.serving.set_error(f"local inference API not started: {err}", publish=False)
            log.error("%s", self.serving.last_error)
            return
        log.info("local inference API on %s", self.service.address)

    def _supervise(self, threads: list[threading.Thread]) -> None:
        """Until stopped: ping systemd's watchdog while every worker is alive and inference keeps turning."""
        limit = watchdog.watchdog_interval()
        while not self._stop.wait(limit / 2 if limit else 5.0):
            dead = [t.name for t in threads if not t.is_alive()]
            stuck = time.monotonic() - self.mqtt.beat > STUCK_AFTER_S
            if dead or stuck:
                log.error("not pinging the watchdog: dead threads %s, inference stuck %s", dead, stuck)
                continue
            watchdog.ping()

    # --- MQTT (the network thread: publish the status, enqueue only)
    def _on_connected(self) -> None:
        self.serving.publish_status()
        self.reporter.wake()
        self.installer.put(Reconcile())

    def _on_group_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        self.installer.on_desired(topic, payload, topic.split("/")[-2])

    # --- the hot swap (on the installer's thread, through ServingState.serve)
    def _swapped(self, model: LoadedModel, previous: LoadedModel | None) -> None:
        """The old model serves until this call; requests in flight on it finish, then it closes."""
        self.stats.reset_health()
        self.quality.bind(model)
        if self.service is not None:
            self.service.swap(model, replaces=previous.manifest.model_name if previous else None)
        if previous is not None:
            threading.Thread(target=self._retire, args=(previous,), name="retire", daemon=True).start()

    def _retire(self, model: LoadedModel) -> None:
        """Close a replaced model once nothing uses it: its generations in flight first get the drain time (those
        still running then are cut, and counted), its other requests up to 30 s."""
        cut = model.drain(self.config.generation.drain_s)
        if cut:
            log.warning("%d generations on %s were cut after the drain", cut, model.bundle_id)
        if self.service is None or self.service.wait_idle(model, 30):
            model.close()


__all__ = ["Agent"]
