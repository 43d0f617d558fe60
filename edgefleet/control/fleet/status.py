"""The fleet as the broker knows it: retained status of every device plus its latest telemetry."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from edgefleet.control.fleet.quality_view import QualityRow, of_telemetry
from edgefleet.core.messages import DeviceStatus, MessageError, SlotStatus, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRow:
    """A language model's token figures over the device's last telemetry window."""

    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    tokens_per_s: float | None = None
    streams: int = 0
    cut: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0


def of_generation(tele: Telemetry | None) -> GenerationRow | None:
    g = tele.generation if tele else None
    if g is None:
        return None
    return GenerationRow(
        ttft_p50_ms=g.ttft.p50_ms if g.ttft else None, ttft_p95_ms=g.ttft.p95_ms if g.ttft else None,
        tpot_p50_ms=g.tpot.p50_ms if g.tpot else None, tpot_p95_ms=g.tpot.p95_ms if g.tpot else None,
        tokens_per_s=g.tokens_per_s, streams=g.streams, cut=g.cut, refused=g.refused,
        prompt_tokens=g.prompt_tokens, output_tokens=g.output_tokens,
    )  # fmt: skip


@dataclass(frozen=True)
class DeviceRow:
    """One slot of one device (a device with one model: its default slot; a device with none: one empty row)."""

    device_id: str
    online: bool
    state: str
    profile: str | None
    bundle: str | None
    model: str | None
    provider: str | None
    provider_summary: str | None
    providers_not_chosen: dict[str, str]
    verified: bool
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    requests: int | None
    golden_agreement: float | None
    cpu_percent: float | None
    rss_mb: float | None
    last_error: str | None
    status_age_s: float
    quality: QualityRow = field(default_factory=QualityRow)
    generation: GenerationRow | None = None  # devices serving a language model
    slot: str = DEFAULT_SLOT
    memory_mb: float | None = None  # what the slot's model holds, measured on the device
    latency_objective_ms: float | None = None  # a real-time slot's p95 objective
    refused: str | None = None  # why the device does not run the slot's desired bundle (over its memory budget, ...)
    agent_version: str = ""  # the device's agent
    agent_update: str | None = None  # the agent's own last update, in words (committed, rolled back and why)


class FleetView:
    """Keeps the latest status per device and telemetry per (device, slot) while subscribed; thread-safe
    snapshots."""

    def __init__(self, conn: Connection, topics: Topics) -> None:
        self.topics = topics
        self._lock = threading.Lock()
        self._status: dict[str, DeviceStatus] = {}
        self._telemetry: dict[tuple[str, str], Telemetry] = {}
        self.refused = 0
        conn.subscribe(topics.all_status(), self._on_status)
        conn.subscribe(topics.all_telemetry(), self._on_telemetry, qos=0)

    def _on_status(self, topic: str, payload: bytes, retained: bool) -> None:
        device = self.topics.device_id_of(topic)
        if not device or not payload:
            return
        try:
            status = decode(DeviceStatus, payload)
        except MessageError as err:
            self.refused += 1
            log.warning("ignored status on %s: %s", topic, err)
            return
        with self._lock:
            self._status[device] = status

    def _on_telemetry(self, topic: str, payload: bytes, retained: bool) -> None:
        device = self.topics.device_id_of(topic)
        if not device or not payload:  # no payload: a retained report being deleted (the retained janitor's)
            return
        try:
            telemetry = decode(Telemetry, payload)
        except MessageError as err:
            self.refused += 1
            log.warning("ignored telemetry on %s: %s", topic, err)
            return
        with self._lock:
            self._telemetry[(device, telemetry.slot)] = telemetry

    def statuses(self) -> dict[str, DeviceStatus]:
        with self._lock:
            return dict(self._status)

    def telemetry(self) -> dict[tuple[str, str], Telemetry]:
        with self._lock:
            return dict(self._telemetry)

    def rows(self) -> list[DeviceRow]:
        statuses, telemetry, now = self.statuses(), self.telemetry(), time.time()
        rows = []
        for device, status in sorted(statuses.items()):
            for slot in status.slots or [SlotStatus(slot=DEFAULT_SLOT, state=status.state)]:
                rows.append(_row(device, status, slot, telemetry.get((device, slot.slot)), now))
        return rows

    def wait_for_telemetry(self, timeout: float) -> None:
        """Wait until every online device has reported telemetry (or the timeout passes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            online = {d for d, s in self.statuses().items() if s.online}
            if online and online <= {device for device, _slot in self.telemetry()}:
                return
            time.sleep(0.1)


def _row(device: str, status: DeviceStatus, slot: SlotStatus, tele: Telemetry | None, now: float) -> DeviceRow:
    return DeviceRow(
        device_id=device,
        online=status.online,
        state=slot.state,
        profile=status.profile,
        bundle=slot.active_bundle,
        model=slot.active_model,
        provider=slot.provider_in_use,
        provider_summary=slot.provider_summary,
        providers_not_chosen=slot.providers_not_chosen,
        verified=slot.verified,
        p50_ms=tele.latency.p50_ms if tele else None,
        p95_ms=tele.latency.p95_ms if tele else None,
        p99_ms=tele.latency.p99_ms if tele else None,
        requests=tele.latency.count if tele else None,
        golden_agreement=tele.golden_agreement if tele else None,
        cpu_percent=tele.cpu_percent if tele else None,
        rss_mb=tele.rss_mb if tele else None,
        last_error=slot.last_error or status.last_error,
        status_age_s=round(now - status.ts, 1),
        quality=of_telemetry(tele) if tele else QualityRow(),
        generation=of_generation(tele),
        slot=slot.slot,
        memory_mb=slot.memory_mb,
        latency_objective_ms=slot.latency_objective_ms,
        refused=slot.refused,
        agent_version=status.agent_version,
        agent_update=status.agent_update,
    )
