"""What the agent tells the fleet: retained status, events and telemetry, spooled and flushed in order.

A mixin of `Agent` (agent/daemon.py) and the base of its other workers (install, health, MQTT inference):
every report goes through here, so events and telemetry share one disk spool and one sequence.
"""

from __future__ import annotations

import logging
import queue
import threading

from edgefleet import __version__
from edgefleet.agent import watchdog
from edgefleet.agent.config import AgentConfig
from edgefleet.agent.desired_state import DesiredState
from edgefleet.agent.device_facts import hardware, usable_providers
from edgefleet.agent.link_pacing import LinkPacer
from edgefleet.agent.quality import Quality
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.service import InferenceService
from edgefleet.agent.spool import Spool
from edgefleet.agent.telemetry import RequestStats, ResourceSampler
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceState, DeviceStatus, Event, EventKind, Telemetry
from edgefleet.core.mqtt import Connection
from edgefleet.core.profiles import Profile
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)


class Reporter:
    config: AgentConfig
    topics: Topics
    conn: Connection
    desired: DesiredState
    profile: Profile
    profiles: list[Profile]
    model: LoadedModel | None
    service: InferenceService | None
    state: DeviceState
    last_error: str | None
    stats: RequestStats
    quality: Quality
    resources: ResourceSampler
    spool: Spool
    link: LinkPacer
    _stale: str | None
    _spool_ready: threading.Event
    _requests: queue.Queue[bytes]
    _stop: threading.Event
    _status_lock: threading.Lock

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
            accepts_profiles=[p.name for p in self.profiles],
            groups=self.config.groups,
            hardware=hardware(),
            providers=usable_providers(model),
            active_bundle=model.bundle_id if model else None,
            active_model=f"{model.manifest.model_name}@{model.manifest.model_version}" if model else None,
            provider_in_use=model.provider if model else None,
            provider_summary=model.choice.summary if model else None,
            providers_not_chosen=dict(model.choice.reasons) if model else {},
            verified=bool(model and model.last_golden and model.last_golden.passed),
            last_error=self.last_error,
            desired_stale=self.desired.stale(),
        )
        with self._status_lock:
            if self.conn.connected:
                self.conn.publish(
                    self.topics.status(self.config.device_id), status.encode(), qos=1, retain=True, wait=wait
                )

    def _event(
        self,
        kind: EventKind,
        detail: str,
        *,
        bundle_id: str | None = None,
        progress: float | None = None,
        ts: float | None = None,
    ) -> bool:
        """Spool an event (`ts`: when it happened, if not now); False when the disk could not take it."""
        log.info("event %s %s: %s", kind, bundle_id or "", detail)
        try:
            seq = self.spool.next_sequence()
        except Exception as err:  # a full disk: this event is lost, the agent goes on (status says why)
            log.error("cannot record event %s: %s", kind, err)
            return False
        event = Event(
            device_id=self.config.device_id, kind=kind, bundle_id=bundle_id, detail=detail, progress=progress, seq=seq,
            **({"ts": ts} if ts is not None else {}),
        )  # fmt: skip
        return self._enqueue(self.topics.events(self.config.device_id), event.encode())

    def _check_stale(self) -> None:
        """Freeze detection: report (once per change) when the desired document in force expired."""
        stale = self.desired.stale()
        if stale != self._stale:
            self._stale = stale
            if stale:
                log.warning("%s", stale)
                self._event("desired-stale", stale)
            self._publish_status()

    # --- telemetry
    def _telemetry_loop(self) -> None:
        while not self._stop.wait(self.config.telemetry_interval_s):
            try:
                self._check_stale()
                self._publish_telemetry()
            except Exception:  # telemetry must never take the agent down
                log.exception("telemetry failed")

    def _publish_telemetry(self) -> None:
        latency, requests, errors, window_s = self.stats.snapshot()
        model = self.model
        golden = model.last_golden if model else None
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
            errors_by_kind=self._errors_by_kind(),
            spool_depth=self.spool.depth(),
            spool_dropped=self.spool.dropped(),
            seq=self.spool.next_sequence(),
            link=self.link.report(),
            **self.quality.telemetry_fields(model),
        )
        self._enqueue(self.topics.telemetry(self.config.device_id), message.encode())

    def _errors_by_kind(self) -> dict[str, int]:
        """The local API's refusals and failures by kind, and MQTT inference's refusals ("mqtt:" kinds)."""
        found = {k[0]: int(v) for k, v in self.service.metrics.errors.items()} if self.service else {}
        return found | self.stats.refused_by_kind()

    # --- the disk spool between reports and the broker
    def _enqueue(self, topic: str, payload: bytes) -> bool:
        try:
            self.spool.put(topic, payload)
        except Exception as err:  # a full disk: the report is lost, the agent goes on (status says why)
            log.error("cannot spool a report for %s: %s", topic, err)
            return False
        self._spool_ready.set()
        return True

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
