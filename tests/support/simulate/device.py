"""One simulated agent: a real paho client speaking the agent's protocol, driven by a `SimHost` (simulate.py).

It publishes its retained `DeviceStatus` (online; the will says offline), a `Telemetry` report whenever the
host ticks it, and `Event`s on installs, all QoS 1 with the per-device `seq` the agent uses. It follows its
retained desired topics like the agent does: fetch the signed offer, refuse another profile or a version that
is not newer (unless the Desired is a rollback), fetch the retained blocks through a window of subscriptions,
check each block's sha256 against the offer, then report downloaded/installed/committed and the new status.

With a `ResendPolicy` (`SimSettings.resend`), telemetry and events go through a `MemorySpool` (spool.py) as the
agent's go through its disk spool: each stays until the control plane's retained `StoredUpTo` on the device's
`stored` topic covers it, what the broker took but the host did not store is sent again after the agent's delay and
at its rate, and a full spool drops its oldest reports and says so with a `reports-dropped` event. Without one, a
device fires and forgets (what the broker acknowledged is the device's last word on it).

What is simulated: inference (latency and golden agreement come from `Behavior`, per bundle), the signature
check (the simulator holds no keys) and the disk (blocks are hashed, not written). Its link counters count the
block bytes it really received, as the agent's do.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgefleet.control.desired.signing import unverified_desired
from edgefleet.core.bundle.manifest import parse_version
from edgefleet.core.messages import (
    BundleOffer,
    Desired,
    DeviceState,
    DeviceStatus,
    Event,
    EventKind,
    Hardware,
    LatencySummary,
    LinkReport,
    MessageError,
    SlotStatus,
    StoredUpTo,
    Telemetry,
    decode,
)
from edgefleet.core.profiles import profile_lineage
from edgefleet.core.topics import DEFAULT_SLOT, Topics
from edgefleet.core.transfer.chunks import piece_ok, piece_topics, with_pages_read

from support.simulate.quality import ShadowState, quality_fields
from support.simulate.scenario import Behavior, BundleBehavior
from support.simulate.spool import MemorySpool, ResendPolicy

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0-sim"
RECONNECT_S = (1.0, 2.0)  # a lost connection is retried after this long (uniform), then every 2 s


@dataclass(frozen=True)
class SimSettings:
    """What every simulated device of one fleet shares and never changes."""

    topics: Topics
    protocol: MQTTProtocolVersion
    hardware: Hardware
    block_window: int  # block subscriptions in flight per download
    raw_prefix: str  # topics whose bytes are only counted (a raw bandwidth baseline)
    # spool reports until stored and re-send, as the agent does; None: fire and forget
    resend: ResendPolicy | None = None


class SimHost(Protocol):
    """All a simulated device sees of the fleet that drives it (simulate.py's `SimFleet`)."""

    settings: SimSettings
    stats: SimStats
    behavior: Behavior
    stopping: bool  # shutting down: no reconnects
    quiet: bool  # no more telemetry (stopping: waiting for the last acknowledgements)

    def schedule(self, due: float, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread at monotonic time `due`."""

    def watch(self, client: paho.Client) -> None:
        """Drive this client's socket from the host's loop."""

    def committed(self, device_id: str, bundle_id: str) -> None:
        """A device now serves `bundle_id`."""


@dataclass
class _Download:
    desired: Desired
    offer: BundleOffer | None = None
    model: str = ""
    requested: set[int] = field(default_factory=set)
    pieces: list[str] = field(default_factory=list)  # the topic of each block or chunk (core/transfer/chunks.py)
    pages: dict[int, bytes] = field(default_factory=dict)  # index pages of a long chunk list, by piece
    next_missing: int = 0
    held: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class SimStats:
    telemetry_sent: int = 0
    telemetry_acked: int = 0
    events_sent: int = 0
    events_acked: int = 0
    connects: int = 0
    disconnects: int = 0
    installs: int = 0
    refusals: int = 0
    block_bytes: int = 0
    corrupt_blocks: int = 0
    raw_bytes: int = 0
    raw_messages: int = 0
    raw_last: float = 0.0
    resent: int = 0  # reports published again (the broker took them before, the host had not stored them)
    spool_dropped: int = 0  # reports a full spool dropped
    drops_announced: int = 0  # `reports-dropped` events
    stored_acks: int = 0  # `StoredUpTo` messages received
    stored_delay_ds: dict[int, int] = field(default_factory=dict)  # first send to stored, in 0.1 s steps: count

    def as_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in self.__dict__.items()}

    def stored_after(self, seconds: float) -> None:
        step = int(seconds * 10)
        self.stored_delay_ds[step] = self.stored_delay_ds.get(step, 0) + 1


class SimDevice:
    def __init__(self, host: SimHost, device_id: str, profile: str, groups: Sequence[str]) -> None:
        self.host, self.device_id, self.profile, self.groups = host, device_id, profile, list(groups)
        self.topics = host.settings.topics
        self.seq = 0
        self.state: DeviceState = "idle"
        self.active_bundle: str | None = None
        self.active_model: str | None = None
        self.versions: dict[str, str] = {}
        self.installed_at = 0.0
        self.served = 0
        self.bulk_bytes = 0  # bundle bytes received, as the agent's link counters count them
        self.download: _Download | None = None
        self.shadow: ShadowState | None = None
        self.desired_docs: dict[bool, Desired] = {}  # True: its own desired topic, False: a group's
        self.connected = False
        self.dead = False  # killed: sends nothing more, never reconnects
        self.pending_acks: dict[int, tuple[str, int]] = {}
        self.acked_telemetry: list[int] = []  # seqs of reports the broker acknowledged (once each)
        self.spool = MemorySpool(host.settings.resend) if host.settings.resend else None
        self.client = self._client()

    def _client(self) -> paho.Client:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"edgefleet-sim-{self.device_id}",
                             protocol=self.host.settings.protocol)  # fmt: skip
        client.will_set(self.topics.status(self.device_id), self.offline_status().encode(), qos=1, retain=True)
        client.max_inflight_messages_set(64)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.user_data_set(self)
        self.host.watch(client)
        return client

    # --- paho callbacks (the loop thread)
    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.warning("sim %s refused: %s", self.device_id, reason)
            return
        self.connected = True
        self.host.stats.connects += 1
        self.publish_status()
        client.subscribe(self.topics.device_desired(self.device_id, DEFAULT_SLOT), 1)  # a simulated device: one slot
        for group in self.groups:
            client.subscribe(self.topics.group_desired(group, DEFAULT_SLOT), 1)
        if self.spool is not None:
            client.subscribe(self.topics.stored(self.device_id), 1)
            self.flush()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connected = False
        self.host.stats.disconnects += 1
        if self.spool is not None:
            self.spool.disconnected()
        if not self.host.stopping and not self.dead:
            self.host.schedule(time.monotonic() + random.uniform(*RECONNECT_S), self._reconnect)

    def _reconnect(self) -> None:
        if self.connected or self.host.stopping or self.dead:
            return
        try:
            self.client.reconnect()
        except OSError:
            self.host.schedule(time.monotonic() + 2.0, self._reconnect)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        kind, seq = self.pending_acks.pop(mid, ("", 0))
        first = self.spool.acked(seq, time.monotonic()) if self.spool is not None and seq else True
        if not first:  # a re-send the broker took again
            return
        if kind == "telemetry":
            self.host.stats.telemetry_acked += 1
            self.acked_telemetry.append(seq)
        elif kind == "event":
            self.host.stats.events_acked += 1

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        topic, payload = message.topic, bytes(message.payload)
        try:
            if "/blocks/" in topic or "/chunks/" in topic:
                self._on_block(topic, payload)
            elif topic.endswith("/manifest"):
                self._on_offer(payload)
            elif topic.endswith("/desired/" + DEFAULT_SLOT):
                self._on_desired(topic, payload)
            elif self.spool is not None and topic == self.topics.stored(self.device_id):
                self._on_stored(payload)
            elif topic.startswith(self.host.settings.raw_prefix):
                stats = self.host.stats
                stats.raw_bytes += len(payload)
                stats.raw_messages += 1
                stats.raw_last = time.time()
        except MessageError as err:
            self.event("refused", f"message on {topic}: {err}")

    # --- reporting
    def publish(self, topic: str, payload: bytes, kind: str, retain: bool = False, seq: int = 0) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        self.pending_acks[info.mid] = (kind, seq)

    def publish_status(self) -> None:
        status = DeviceStatus(
            device_id=self.device_id, online=True, state=self.state, agent_version=AGENT_VERSION,
            profile=self.profile, groups=self.groups, hardware=self.host.settings.hardware,
            providers=["CPUExecutionProvider"], slots=self.slots(),
        )  # fmt: skip
        self.publish(self.topics.status(self.device_id), status.encode(), "status", retain=True)

    def slots(self) -> list[SlotStatus]:
        """The default slot, once the device runs or fetches a bundle (the one it installs into), and the
        neighbours the behaviour gives it (slots it serves as they are)."""
        neighbours = [
            SlotStatus(
                slot=name,
                state="serving",
                active_bundle=n.bundle_id,
                active_model=f"{n.bundle_id}@1",
                provider_in_use="CPUExecutionProvider",
                verified=True,
                slot_class="real-time",
                latency_objective_ms=n.objective_ms,
            )
            for name, n in sorted(self.host.behavior.neighbours.items())
        ]
        if self.active_bundle is None and self.state == "idle":
            return neighbours
        return [
            SlotStatus(
                slot=DEFAULT_SLOT,
                state=self.state,
                active_bundle=self.active_bundle,
                active_model=self.active_model,
                provider_in_use="CPUExecutionProvider" if self.active_bundle else None,
                verified=self.active_bundle is not None,
            ),
            *neighbours,
        ]

    def neighbour_reports(self, interval: float) -> list[Telemetry]:
        """One report per neighbour slot: its p95 beside what the default slot runs now."""
        reports = []
        for name, n in sorted(self.host.behavior.neighbours.items()):
            p95 = n.p95_beside.get(self.active_bundle or "", n.p95_ms)
            self.seq += 1
            reports.append(Telemetry(
                device_id=self.device_id, seq=self.seq, slot=name, bundle_id=n.bundle_id,
                provider="CPUExecutionProvider", window_s=interval, requests=50, errors=0,
                throughput_rps=round(50 / interval, 3),
                latency=LatencySummary(count=50, p50_ms=p95 / 1.6, p95_ms=p95, p99_ms=p95 * 1.2),
                golden_agreement=None, golden_max_abs_error=None, cpu_percent=1.0, rss_mb=60.0,
            ))  # fmt: skip
        return reports

    def offline_status(self) -> DeviceStatus:
        """What the last will says, and what a graceful stop publishes."""
        return DeviceStatus(device_id=self.device_id, online=False, state="offline", agent_version=AGENT_VERSION,
                            profile=self.profile, groups=self.groups)  # fmt: skip

    def say_offline(self) -> None:
        """A graceful stop: the offline status, then DISCONNECT (no last will)."""
        if self.connected:
            self.publish(self.topics.status(self.device_id), self.offline_status().encode(), "status", retain=True)
            self.client.disconnect()

    def die(self) -> Any:
        """A power cut: the device stops for good, and the host closes the returned socket (no DISCONNECT, so the
        broker publishes the last will)."""
        self.dead, self.connected = True, False
        return self.client.socket()

    def event(
        self, kind: EventKind, detail: str, bundle_id: str | None = None, progress: float | None = None,
        dropped_through: int | None = None,
    ) -> None:  # fmt: skip
        self.seq += 1
        message = Event(device_id=self.device_id, kind=kind, seq=self.seq, bundle_id=bundle_id, detail=detail,
                        progress=progress, dropped_through=dropped_through)  # fmt: skip
        self.host.stats.events_sent += 1
        if self.spool is not None:
            self._spool("event", self.topics.events(self.device_id), message.encode())
        else:
            self.publish(self.topics.events(self.device_id), message.encode(), "event")

    # --- the spool (with a ResendPolicy): what the agent's Reporter does
    def _spool(self, kind: str, topic: str, payload: bytes) -> None:
        assert self.spool is not None
        dropped = self.spool.put(self.seq, kind, topic, payload)
        self.host.stats.spool_dropped += len(dropped)
        self.flush()

    def flush(self) -> None:
        """Publish what the spool says is due (re-sends first, then what the broker has not taken), as the agent's
        flush thread does when it wakes; first, after a full spool dropped reports, the `reports-dropped` event."""
        spool = self.spool
        if spool is None or not self.connected or self.dead:
            return
        through = spool.drops_to_announce()
        if through is not None:
            spool.announced(through)
            self.host.stats.drops_announced += 1
            detail = (f"the report spool was full ({spool.policy.max_records} records): {spool.dropped} reports "
                      f"dropped so far; those numbered up to {through} and not stored are lost")  # fmt: skip
            self.event("reports-dropped", detail, dropped_through=through)  # spooled, and flushed with the rest
            return
        resent = spool.resent
        for record in spool.flush(time.monotonic()):
            self.publish(record.topic, record.payload, record.kind, seq=record.seq)
        self.host.stats.resent += spool.resent - resent

    def _on_stored(self, payload: bytes) -> None:
        assert self.spool is not None
        if not payload:  # a retained acknowledgement being cleared
            return
        try:
            message = decode(StoredUpTo, payload)
        except MessageError as err:
            log.warning("sim %s refused a storage acknowledgement: %s", self.device_id, err)
            return
        if message.device_id != self.device_id:
            return
        now = time.monotonic()
        self.host.stats.stored_acks += 1
        for record in self.spool.stored(message.up_to):
            if record.kind == "telemetry" and record.first_sent is not None:
                self.host.stats.stored_after(now - record.first_sent)
        self.flush()

    def telemetry(self, interval: float) -> None:
        if self.host.quiet or (not self.connected and self.spool is None):  # an agent spools while disconnected
            return
        behavior = self.host.behavior
        bundle = behavior.bundles.get(self.active_bundle or "", BundleBehavior())
        requests = int(behavior.requests_per_s * interval) if self.active_bundle else 0
        error_rate = max(behavior.error_rate, bundle.error_rate)
        errors = round(requests * error_rate)
        probes = int(behavior.probes_per_s * interval) if self.active_bundle and not requests else 0
        self.served += requests + errors + probes
        jitter = 1.0 + (random.random() - 0.5) * 0.1
        p50 = behavior.latency_ms * bundle.latency_factor * jitter
        has_latency = self.active_bundle is not None and self.served > 0
        self.seq += 1
        report = Telemetry(
            device_id=self.device_id, seq=self.seq, bundle_id=self.active_bundle,
            provider="CPUExecutionProvider" if self.active_bundle else None, window_s=interval,
            requests=requests, errors=errors, throughput_rps=round(requests / interval, 3),
            latency=LatencySummary(
                count=min(4096, self.served) if has_latency else 0, p50_ms=round(p50, 4) if has_latency else None,
                p95_ms=round(p50 * 1.6, 4) if has_latency else None,
                p99_ms=round(p50 * 2.2, 4) if has_latency else None,
            ),
            golden_agreement=bundle.golden_agreement if self.active_bundle else None,
            golden_max_abs_error=0.0 if self.active_bundle else None, cpu_percent=1.0, rss_mb=60.0,
            link=LinkReport(bulk_bytes=self.bulk_bytes, clock_s=round(time.monotonic(), 4)),
            **quality_fields(
                bundle.quality, self.shadow,
                behavior.bundles.get(self.shadow.bundle_id, BundleBehavior()).quality if self.shadow else None,
                requests=requests, probes=probes, p95_ms=round(p50 * 1.6, 4) if has_latency else None,
            ),
        )  # fmt: skip
        for one in [report, *self.neighbour_reports(interval)]:
            self.host.stats.telemetry_sent += 1
            if self.spool is not None:
                self._spool("telemetry", self.topics.telemetry(self.device_id), one.encode())
            else:
                self.publish(self.topics.telemetry(self.device_id), one.encode(), "telemetry", seq=one.seq)

    # --- installing
    def _on_desired(self, topic: str, payload: bytes) -> None:
        desired = unverified_desired(payload) if payload else None  # a simulated device trusts the host
        if desired is None or desired.clear:  # real agents verify, and ignore an unsigned (empty) clear
            if topic == self.topics.device_desired(self.device_id, DEFAULT_SLOT):
                self.shadow = None  # back to the group's desired state, which names no shadow
            return
        is_device_topic = topic == self.topics.device_desired(self.device_id, DEFAULT_SLOT)
        self.desired_docs[is_device_topic] = desired
        if not is_device_topic and True in self.desired_docs:
            return  # the device's own desired topic wins over its groups'
        wanted = desired.shadow_bundle_id
        if (self.shadow.bundle_id if self.shadow else None) != wanted:
            self.shadow = ShadowState(wanted) if wanted else None
        if desired.bundle_id == self.active_bundle or (self.download and self.download.desired == desired):
            return
        self._abandon_download()
        self.event("desired", f"{desired.model_name} {desired.model_version} ({desired.bundle_id})", desired.bundle_id)
        self.client.subscribe(self.topics.bundle_offer(desired.bundle_id), 1)
        self.download = _Download(desired)

    def _on_offer(self, payload: bytes) -> None:
        download = self.download
        if download is None or download.offer is not None:
            return
        offer = decode(BundleOffer, payload)
        if offer.bundle_id != download.desired.bundle_id:
            return
        self.client.unsubscribe(self.topics.bundle_offer(offer.bundle_id))
        manifest = json.loads(offer.manifest_json)
        name, version = manifest["model_name"], manifest["model_version"]
        refusal = self.host.behavior.bundles.get(offer.bundle_id, BundleBehavior()).refuse
        running = self.versions.get(name)
        if manifest["profile"] not in profile_lineage(self.profile):
            refusal = f"bundle is built for profile {manifest['profile']}; this device is {self.profile}"
        elif running and parse_version(version) <= parse_version(running) and not download.desired.rollback:
            refusal = f"{name} version {version} is not newer than {running} (a rollback must be marked by the host)"
        if refusal:
            self.download = None
            self.host.stats.refusals += 1
            self.event("refused", refusal, offer.bundle_id)  # as the agent: nothing changed on the device
            return
        download.offer, download.model = offer, f"{name}@{version}"
        download.pieces = piece_topics(self.topics, offer)
        self.event("verified", f"{name} {version} for {self.profile} (signature not checked: simulated)",
                   offer.bundle_id)  # fmt: skip
        self.event("download-started", f"{offer.transfer.size} bytes", offer.bundle_id, 0.0)
        self.state = "downloading"
        self.publish_status()
        self._request_blocks()

    def _request_blocks(self) -> None:
        download = self.download
        assert download is not None and download.offer is not None
        total = len(download.pieces)
        while len(download.requested) < self.host.settings.block_window and download.next_missing < total:
            index = download.next_missing
            download.next_missing += 1
            download.requested.add(index)
            self.client.subscribe(download.pieces[index], 1)

    def _on_block(self, topic: str, payload: bytes) -> None:
        download = self.download
        index = download.pieces.index(topic) if download is not None and topic in download.pieces else None
        if download is None or download.offer is None or index is None or index not in download.requested:
            return
        self.host.stats.block_bytes += len(payload)
        self.bulk_bytes += len(payload)
        self.client.unsubscribe(topic)
        download.requested.discard(index)
        if not piece_ok(download.offer.transfer, index, payload):
            self.host.stats.corrupt_blocks += 1
            download.requested.add(index)
            self.client.subscribe(topic, 1)
            return
        download.held += 1
        if not download.offer.transfer.chunks and download.offer.transfer.index:
            download.pages[index] = payload
        if download.held < len(download.pieces):
            self._request_blocks()
            return
        if download.pages:  # the index pages are read: now the chunks they list
            download.offer = with_pages_read(download.offer, download.pages)
            download.pieces, download.pages = piece_topics(self.topics, download.offer), {}
            download.held = download.next_missing = 0
            self._request_blocks()
            return
        self._commit(download)

    def _commit(self, download: _Download) -> None:
        assert download.offer is not None
        bundle_id = download.offer.bundle_id
        self.download = None
        self.event("downloaded", f"{download.offer.transfer.size} bytes, block hashes ok", bundle_id, 1.0)
        self.event("installed", "simulated golden set passed", bundle_id)
        previous = self.active_bundle
        name, _, version = download.model.rpartition("@")
        self.active_bundle, self.active_model = bundle_id, download.model
        self.versions[name] = version
        self.served = 0
        self.state = "serving"
        self.host.stats.installs += 1
        self.host.committed(self.device_id, bundle_id)
        self.publish_status()
        self.event("committed", "now serving (simulated)" + (f" (was {previous})" if previous else ""), bundle_id)

    def _abandon_download(self) -> None:
        download, self.download = self.download, None
        if download is None:
            return
        if download.offer is None:
            self.client.unsubscribe(self.topics.bundle_offer(download.desired.bundle_id))
            return
        for index in download.requested:
            self.client.unsubscribe(download.pieces[index])


__all__ = ["AGENT_VERSION", "RECONNECT_S", "SimDevice", "SimHost", "SimSettings", "SimStats"]
