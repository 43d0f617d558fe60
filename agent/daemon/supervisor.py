"""The agent daemon: it builds the parts, wires them to MQTT, owns their threads and supervises them.

paho's network thread only decodes and enqueues; installs and inference run on their own threads so a long
download never blocks inference and a bad message never reaches the runtime unchecked. The parts, each with its
dependencies given here and nothing shared behind them:

    Slots           one model per slot (agent/daemon/slots.py), each with its own install worker (signed desired
                    state, installs, commits, rollbacks, removal: agent/install/), health monitor, request
                    statistics and quality; one MemoryBudget admits their models (agent/install/admission.py)
    MqttInference   inference over MQTT by slot (agent/api/mqtt.py); InferenceService is the local HTTP API
    MqttGeneration  generation over MQTT, on workers of its own; it shares `GenerationParts` (one gate bounding
                    generations device-wide, one accounting) with the local API
    Reporter        status, events and telemetry through the disk spool (agent/telemetry/)
    Heartbeat       the freeze check and the telemetry message on a timer (agent/daemon/heartbeat.py)

What each slot serves and its state live in its `SlotServing` (agent/install/serving.py), changed only on that slot's
install thread; the device's status (`DeviceServing`) lists every slot. The hot swap a slot triggers is `_swapped`
here: the new model serves at once in that slot (other slots untouched), and the old one is closed once its
requests are done; a generative model's streams in flight get `generation.drain_s` to finish before they are cut.
A state directory written by a single-model agent is migrated first (its bundle runs in slot "default").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

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
from edgefleet.agent.daemon.slots import Slots, SlotSettings
from edgefleet.agent.install import (
    DesiredRefused,
    DesiredState,
    DeviceServing,
    DeviceTrust,
    HealthPolicy,
    Identity,
    InstallContext,
    MemoryBudget,
    Store,
    migrate_single_model,
)
from edgefleet.agent.install.installer import fetch_candidate
from edgefleet.agent.quality import FieldAccuracy
from edgefleet.agent.release import HealthGate, ReleaseUpdater
from edgefleet.agent.runtime import BenchmarkService, LoadedModel, RuntimeOptions
from edgefleet.agent.schedule.gate import ComputeGate
from edgefleet.agent.telemetry import Reporter, RequestStats, ResourceSampler, Spool
from edgefleet.agent.transfer import LinkPacer
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection, Will
from edgefleet.core.profiles import detect_explained, device_profiles
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import TrustedKeys

if TYPE_CHECKING:
    from edgefleet.agent.quality.probe import Prober

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
        self.stats = RequestStats()  # the generations' (every path's; telemetry puts them in the generative slot's)
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
        migrate_single_model(config.state_dir)  # before any Store: a single-model layout becomes slot "default"'s
        store = Store(config.state_dir, keep_previous=config.keep_previous)
        trust = DeviceTrust(TrustedKeys.load(config.trusted_paths), store, config.keyset)
        self.desired = DesiredState(cid, config.groups, trust, store)
        self.reporter = Reporter(
            self.conn, self.topics, cid, Spool(config.state_dir / "outbox.sqlite", config.spool_max_records),
            resend_after_s=config.report_resend_after_s, resend_per_s=config.report_resend_per_s,
        )  # fmt: skip
        identity = Identity(cid, profile.name, tuple(p.name for p in profiles), tuple(config.groups), tuple(detection))
        budget_mb = config.memory_budget_mb or profile.memory_budget_mb
        self.budget = MemoryBudget(budget_mb)
        self.serving = DeviceServing(
            identity, self.reporter, self.desired, watchdog.status, lambda: round(self.budget.free_mb(), 1)
        )
        self.field = FieldAccuracy()  # one field-accuracy record for every slot and path (keyed by model name)
        self.install_context = InstallContext(
            self.conn, self.topics, store, trust, profile.name,
            RuntimeOptions(config.threads, config.state_dir / "cache", config.selection),
            config.block_window, config.offer_timeout_s, config.min_free_bytes, int(profile.size_limit_mb * 1e6),
            identity.accepts_profiles, self.link,
        )  # fmt: skip
        self.slots = Slots(
            settings=SlotSettings(
                threads=config.threads, quality=config.quality, retry_delay_s=config.retry_delay_s,
                rollback_on_failure=config.rollback_on_failure,
                health=HealthPolicy(config.health_interval_s, config.max_failure_ratio, config.failure_window),
            ),
            context=self.install_context, desired=self.desired, device=self.serving, reporter=self.reporter,
            link=self.link, budget=self.budget, field=self.field, on_swap=self._swapped, generation_stats=self.stats,
        )  # fmt: skip
        self.refusals = RequestStats()  # MQTT requests refused before a slot is known
        # The scheduler (agent/schedule/gate.py): every run, batch and generated token of every path is a step of its
        # model's slot, ordered by the slot's class (its desired state's `slot_class`, assigned at each swap). Lanes:
        # as many interactive and batch steps as the device ran at once before (inference places and generations);
        # a real-time slot's step never waits behind them.
        http = config.http or ServiceConfig()
        self.compute = ComputeGate(lanes=http.concurrency + config.generation.concurrency)
        self.mqtt = MqttInference(
            self.conn, self.topics, cid, self.slots.route, self.refusals, self._feedback, compute=self.compute,
        )  # fmt: skip
        self.metrics = ServiceMetrics()  # the local API's, and the model failures of generations over MQTT
        self.generation = GenerationParts.build(config.generation, self.stats, self.metrics).with_compute(self.compute)
        self.mqtt_generation = MqttGeneration(self.conn, self.topics, cid, self._served, self.generation)
        # The agent's own update (agent/release/): a release named by the signed desired state, handed to the launcher.
        self.release = ReleaseUpdater(
            self.install_context, self.desired, self.reporter, config.state_dir, config.launcher,
            on_change=self._publish_status_soon, retry_delay_s=config.retry_delay_s,
            max_release_bytes=int(config.max_release_mb * 2**20),
        )  # fmt: skip
        self.serving.agent_update = self.release.status_text
        self.gate: HealthGate | None = None
        self.heartbeat = Heartbeat(
            interval_s=config.telemetry_interval_s, reporter=self.reporter, serving=self.serving, slots=self.slots,
            desired=self.desired, refusals=self.refusals, generations=self.stats, resources=ResourceSampler(),
            link=self.link, mqtt=self.mqtt, service=lambda: self.service, compute=self.compute,
        )  # fmt: skip

    # --- lifecycle
    def run(self) -> None:
        """Serve until `stop()`; the broker may come and go meanwhile."""
        store = self.install_context.store
        removed = store.clean_incomplete()
        if removed:
            log.info("removed incomplete installs left by a crash: %s", ", ".join(removed))
        if self.config.trial_token and self.config.launcher:  # on trial: the gate is what committed at start
            committed = {s: b for s in store.slots() if (b := store.for_slot(s).load_state().committed)}
            self.gate = HealthGate(self.config.launcher, self.config.trial_token, committed, self.serving,
                                   lambda: self.conn.connected)  # fmt: skip
        self.slots.restore()
        if self.config.http is not None:
            self._start_service(self.config.http)
        cid = self.config.device_id
        self.conn.subscribe(self.topics.device_desired_slots(cid), lambda t, p, r: self._on_desired(t, p, None))
        for group in self.config.groups:
            self.conn.subscribe(self.topics.group_desired_slots(group), self._on_group_desired)
        self.conn.subscribe(self.topics.infer_request(cid), self.mqtt.on_request, qos=0)
        self.conn.subscribe(self.topics.infer_feedback(cid), self.mqtt.on_feedback, qos=0)
        self.conn.subscribe(self.topics.generate_request(cid), self.mqtt_generation.on_request)
        self.conn.subscribe(self.topics.stored(cid), self.reporter.on_stored)  # the control plane stored up to
        benchmark = BenchmarkService(
            self.conn, self.topics, cid, list(self.serving.identity.accepts_profiles), self.config.threads,
            self.config.selection, self._fetch_candidate, self.config.state_dir / "benchmark",
            self.config.benchmark_max_cpu_share,
        ).start()  # fmt: skip
        self.conn.start(wait=None)
        self.slots.start(self._stop)
        threads = [
            threading.Thread(target=self.mqtt.run, args=(self._stop,), name="inference", daemon=True),
            threading.Thread(target=self.heartbeat.run, args=(self._stop,), name="telemetry", daemon=True),
            threading.Thread(target=self.reporter.run_flush, args=(self._stop,), name="spool-flush", daemon=True),
            threading.Thread(target=self.release.run, args=(self._stop,), name="agent-release", daemon=True),
        ]
        for thread in threads:
            thread.start()
        if self.gate is not None:  # ends once it reported: not one of the supervised threads
            threading.Thread(target=self.gate.run, args=(self._stop,), name="health-gate", daemon=True).start()
        self.mqtt_generation.start()
        # Ready once serving locally: waiting for the broker would turn a broker outage into a restart loop.
        watchdog.ready(self.serving.state)
        self._supervise(threads)
        watchdog.stopping()
        benchmark.stop()
        self.mqtt_generation.stop()
        self.slots.stop()
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
        self.slots.stop()

    def _start_service(self, config: ServiceConfig) -> None:
        """The local API is a convenience: if its port is taken the agent still installs and serves over MQTT."""
        try:
            self.service = InferenceService(
                (), config, metrics=self.metrics, generation=self.generation, on_model_answer=self._answered,
                on_model_failure=self._failed, compute=self.compute,
            )  # fmt: skip
            for name, model in sorted(self.serving.models().items()):
                self.service.swap(model, slot=name)
            self.service.repository = self.slots.repository
            self.service.field = self.field  # one field-accuracy record (and every slot's observers) for every path
            self.service.start()
        except OSError as err:
            self.service = None
            self.serving.set_error(f"local inference API not started: {err}", publish=False)
            log.error("%s", self.serving.last_error)
            return
        log.info("local inference API on %s", self.service.address)

    def _supervise(self, threads: list[threading.Thread]) -> None:
        """Until stopped: ping systemd's watchdog while every worker is alive and inference keeps turning."""
        limit = watchdog.watchdog_interval()
        while not self._stop.wait(limit / 2 if limit else 5.0):
            dead = [t.name for t in [*threads, *self.slots.threads()] if not t.is_alive()]
            stuck = time.monotonic() - self.mqtt.beat > STUCK_AFTER_S
            if dead or stuck:
                log.error("not pinging the watchdog: dead threads %s, inference stuck %s", dead, stuck)
                continue
            watchdog.ping()

    # --- MQTT (the network thread: publish the status, check and enqueue only)
    def _on_connected(self) -> None:
        self.serving.publish_status()
        self.reporter.wake()
        self.slots.reconcile()
        self.release.wake()

    def _publish_status_soon(self) -> None:
        """The agent-release thread's news (its status line changed): the retained status says it now."""
        if self.conn.connected:
            with contextlib.suppress(BrokerError):
                self.serving.publish_status()

    def _on_group_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        self._on_desired(topic, payload, topic.split("/")[-3])

    def _on_desired(self, topic: str, payload: bytes, group: str | None) -> None:
        """A slot's signed desired state (agent/install/desired.py): valid only for the slot of its topic; a
        refused document is reported and never acted on."""
        slot = self.topics.desired_slot_of(topic)
        if slot is None:
            log.warning("ignored a message on %s: not a slot's desired topic", topic)
            return
        try:
            self.desired.on_message("group" if group else "device", group, slot, payload)
        except DesiredRefused as err:
            log.warning("refused message on %s: %s", topic, err)
            self.reporter.event("refused", f"message on {topic}: {err}", slot=slot)
            return
        self.link.apply_desired(self.desired.effective(slot))
        parts = self.slots.get(slot)
        model = parts.serving.model if parts is not None else None
        if model is not None:  # a new class needs no new bundle
            before = self.compute.class_of(model.manifest.model_name)
            self._classify(slot, model)
            now = self.compute.class_of(model.manifest.model_name)
            if now != before:  # the retained status says the class in force
                log.info("slot %s (%s): class %s, was %s", slot, model.manifest.model_name, now, before)
                self.serving.publish_status()
        self.slots.reconcile()  # this slot's document; a removal may also let a refused slot fit
        self.release.wake()  # any slot's document may name an agent release

    def _classify(self, slot: str, model: LoadedModel) -> None:
        """The scheduler's class for the slot's model (the gate keys steps by model name), as the slot's desired
        state says now."""
        desired = self.desired.effective(slot)
        self.compute.assign(model.manifest.model_name, desired.slot_class if desired else "interactive")

    def _feedback(self, payload: bytes) -> bool:
        """MQTT feedback: the field-accuracy record every slot shares."""
        slots = list(self.slots.all().values())
        if not slots:
            return False
        return slots[0].quality.feedback(payload)

    # --- the local API's accounting: by the model's slot
    def _slot_stats(self, model_name: str) -> RequestStats:
        for parts in self.slots.all().values():
            model = parts.serving.model
            if model is not None and model.manifest.model_name == model_name:
                return parts.stats
        return self.refusals  # a model swapped out meanwhile: counted, in no slot's window

    def _answered(self, model_name: str, latency_ms: float) -> None:
        self._slot_stats(model_name).record(latency_ms)

    def _failed(self, model_name: str) -> None:
        self._slot_stats(model_name).record_failure()

    def _served(self) -> dict[str, LoadedModel]:
        """model name -> model, of every serving slot (generation over MQTT picks by name)."""
        return {m.manifest.model_name: m for m in self.serving.models().values()}

    def _fetch_candidate(self, bundle_id: str, folder: Path) -> tuple[Path, Manifest]:
        return fetch_candidate(self.install_context, bundle_id, folder)

    # --- the hot swap (on a slot's install thread, through SlotServing.serve / unload)
    def _swapped(self, slot: str, model: LoadedModel | None, previous: LoadedModel | None) -> None:
        """The old model serves until this call; requests in flight on it finish, then it closes. Only `slot`'s
        model changes."""
        parts = self.slots.get(slot)
        if parts is not None:
            parts.stats.reset_health()
            parts.quality.bind(model)
        if model is not None:
            self._classify(slot, model)
        if model is not None and model.generative is not None:
            self.stats.reset_health()  # the generations' figures judge the new generative model afresh
        if self.service is not None:
            if model is not None:
                self.service.swap(model, replaces=previous.manifest.model_name if previous else None, slot=slot)
            elif previous is not None:
                self.service.remove(slot)
        if previous is not None:
            prober = parts.quality.prober if parts is not None else None
            threading.Thread(target=self._retire, args=(previous, prober), name=f"retire-{slot}", daemon=True).start()

    def _retire(self, model: LoadedModel, prober: Prober | None = None) -> None:
        """Close a replaced model once nothing uses it: its generations in flight first get the drain time (those
        still running then are cut, and counted), its other requests and the slot's golden-set probe up to 30 s."""
        cut = model.drain(self.config.generation.drain_s)
        if cut:
            log.warning("%d generations on %s were cut after the drain", cut, model.bundle_id)
        probed = prober is None or prober.wait_idle(model, 30)
        if probed and (self.service is None or self.service.wait_idle(model, 30)):
            model.close()


__all__ = ["Agent"]
