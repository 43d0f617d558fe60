"""Ingestion: device status, telemetry and events from MQTT into the store.

- Telemetry and events arrive through shared subscriptions (`$share/{group}/{prefix}/devices/+/telemetry`),
  so several control-plane processes split them: the broker hands each message to one member. Mosquitto 2
  offers shared subscriptions on MQTT 5 and 3.1.1 alike; `share_group=None` subscribes plainly (brokers
  without them, e.g. the embedded amqtt).
- Status is retained and small, and every process needs the whole registry, so it is subscribed plainly
  (a shared subscription would not get the retained statuses anyway).
- Delivery is at least once (QoS 1, agents re-send what the broker did not acknowledge, a persistent
  session re-delivers after a reconnect), so the store drops repeats by (device, seq, ts), across processes.
- paho's network thread only enqueues; one writer thread decodes and writes in batches.
- A malformed message, telemetry from a device the registry does not know, or a payload whose device id
  differs from its topic's is counted, logged (once a minute per device) and dropped; nothing stops ingestion.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from edgefleet.control.store import Store
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus, Event, M, MessageError, Telemetry, decode
from edgefleet.core.mqtt import Connection, Handler
from edgefleet.core.topics import Topics, check_segment

log = logging.getLogger(__name__)

COUNTER_PREFIX = "ingest."
_LOG_EVERY_S = 60.0


@dataclass
class IngestStats:
    """What this process ingested (the store's counters add up every process)."""

    counts: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


class Ingestor:
    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        store: Store,
        *,
        share_group: str | None = "edgefleet",
        batch_max: int = 2000,
        flush_s: float = 0.2,
        queue_max: int = 200_000,
    ) -> None:
        self.conn, self.topics, self.store = conn, topics, store
        self.share_group = share_group
        self.batch_max, self.flush_s = batch_max, flush_s
        self.stats = IngestStats()
        self._inbox: queue.Queue[tuple[str, str, bytes, float]] = queue.Queue(maxsize=queue_max)
        self._known: set[str] = set()
        self._known_refreshed = 0.0
        self._logged: dict[tuple[str, str], float] = {}
        self._unflushed: Counter[str] = Counter()
        self._counters_flushed = time.monotonic()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)

    def shared(self, topic: str) -> str:
        return f"$share/{self.share_group}/{topic}" if self.share_group else topic

    def start(self) -> Ingestor:
        self._refresh_known(force=True)
        self._thread.start()
        status, telemetry, events = self.topics_subscribed()
        self.conn.subscribe(status, self._on("status"))
        self.conn.subscribe(telemetry, self._on("telemetry"))
        self.conn.subscribe(events, self._on("events"))
        return self

    def _own_topic(self, leaf: str) -> str:
        """A topic only this process uses (probes and barriers; nobody else subscribes to it)."""
        return f"{self.topics.prefix}/control/{check_segment('client id', self.conn.client_id)}/{leaf}"

    def check_shared(self, timeout: float = 3.0) -> bool:
        """Does the broker deliver to shared subscriptions? Some accept `$share/...` and deliver nothing (the
        embedded amqtt). If not, fall back to plain subscriptions: this process then ingests everything, so
        run one per broker. Call once connected."""
        if not self.share_group:
            return True
        probe = self._own_topic("share-probe")
        shared = f"$share/{self.share_group}/{probe}"
        got = threading.Event()
        self.conn.subscribe(shared, lambda _t, _p, _r: got.set())
        try:
            self.conn.publish(probe, b"", qos=1, wait=5.0)  # after the SUBSCRIBE: the broker keeps their order
            ok = got.wait(timeout)
        except BrokerError:
            ok = False
        self.conn.unsubscribe(shared)
        if not ok:
            log.warning(
                "the broker at %s delivers nothing to shared subscriptions; ingesting through plain ones "
                "(run a single control-plane process against this broker)",
                self.conn.address,
            )
            _, telemetry, events = self.topics_subscribed()
            self.conn.unsubscribe(telemetry)
            self.conn.unsubscribe(events)
            self.share_group = None
            self.conn.subscribe(self.topics.all_telemetry(), self._on("telemetry"))
            self.conn.subscribe(self.topics.all_events(), self._on("events"))
        return ok

    def topics_subscribed(self) -> list[str]:
        return [
            self.topics.all_status(),
            self.shared(self.topics.all_telemetry()),
            self.shared(self.topics.all_events()),
        ]

    def retire(self) -> None:
        """Leave the shared subscriptions, so the broker hands this process's share to the other members
        instead of queueing it in this process's persistent session (call before the connection stops)."""
        for topic in self.topics_subscribed():
            self.conn.unsubscribe(topic)
        # A barrier: the broker handles one client's packets in order, so once this QoS 1 publish is
        # acknowledged the UNSUBSCRIBEs before it took effect (Connection hides their UNSUBACKs).
        barrier = self._own_topic("retired")
        try:
            self.conn.publish(barrier, b"", qos=1, wait=5.0)
        except BrokerError as err:
            log.warning("leaving the shared subscriptions was not confirmed: %s", err)

    def stop(self) -> None:
        """Write what was received and stop. Stop the connection first: unless `retire()`d, the subscriptions
        stay in the broker's persistent session, which queues for this client until it is back."""
        self._stop.set()
        self._thread.join(10)
        self._flush_counters(force=True)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything received so far is written (tests, benchmarks, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._idle.clear()
            idle = self._inbox.empty() and self._idle.wait(max(0.01, min(1.0, deadline - time.monotonic())))
            if idle and self._inbox.empty():
                return True
        return False

    def _on(self, kind: str) -> Handler:
        def handler(topic: str, payload: bytes, retained: bool) -> None:
            self._inbox.put((kind, topic, payload, time.time()))

        return handler

    # --- writer thread
    def _run(self) -> None:
        while not self._stop.is_set() or not self._inbox.empty():
            batch = self._collect()
            if not batch:
                self._idle.set()
                self._flush_counters()
                continue
            try:
                self._write(batch)
            except Exception:  # the store may be busy or broken; ingestion goes on with the next batch
                log.exception("writing %d messages to the store failed; they are lost", len(batch))
                self._count("store_errors", len(batch))
            self._flush_counters()

    def _collect(self) -> list[tuple[str, str, bytes, float]]:
        try:
            first = self._inbox.get(timeout=0.2)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self.flush_s
        while len(batch) < self.batch_max:
            try:
                batch.append(self._inbox.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _write(self, batch: list[tuple[str, str, bytes, float]]) -> None:
        statuses: list[DeviceStatus] = []
        telemetry: list[Telemetry] = []
        events: list[Event] = []
        received_at = batch[-1][3]
        for kind, topic, payload, _ in batch:
            self._count("received")
            device_id = self.topics.device_id_of(topic)
            if device_id is None:
                continue
            if kind == "status":
                if not payload:  # a cleared retained status
                    continue
                status = self._decode(DeviceStatus, payload, device_id, topic)
                if status is not None:
                    statuses.append(status)
                    self._known.add(device_id)
                continue
            message: Telemetry | Event | None = (
                self._decode(Telemetry, payload, device_id, topic)
                if kind == "telemetry"
                else self._decode(Event, payload, device_id, topic)
            )
            if message is None:
                continue
            if device_id not in self._known and not self._refresh_known(device_id):
                self._count("unknown_device")
                self._warn(device_id, "unknown", "dropped %s from unknown device %s (no status seen)", kind, device_id)
                continue
            if isinstance(message, Telemetry):
                telemetry.append(message)
            else:
                events.append(message)
        self.store.upsert_statuses(statuses, received_at)
        self._count("statuses", len(statuses))
        stored = self.store.add_telemetry(telemetry, received_at)
        self._count("telemetry", stored)
        stored_events = self.store.add_events(events, received_at)
        self._count("events", stored_events)
        self._count("duplicates", len(telemetry) - stored + len(events) - stored_events)

    def _decode(self, kind: type[M], payload: bytes, device_id: str, topic: str) -> M | None:
        try:
            message = decode(kind, payload)
        except MessageError as err:
            self._count("malformed")
            self._warn(device_id, "malformed", "dropped a malformed message on %s: %s", topic, err)
            return None
        named = getattr(message, "device_id", None)
        if named != device_id:
            self._count("mismatched")
            self._warn(device_id, "mismatched", "dropped a message on %s that names device %s", topic, named)
            return None
        return message

    def _refresh_known(self, device_id: str | None = None, force: bool = False) -> bool:
        """Reload the known devices (another process may have seen the status), at most once a second."""
        now = time.monotonic()
        if force or now - self._known_refreshed > 1.0:
            self._known |= self.store.device_ids()
            self._known_refreshed = now
        return device_id in self._known if device_id else True

    def _warn(self, device_id: str, what: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._logged.get((device_id, what), -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._logged[(device_id, what)] = now
            log.warning(message, *args)

    def _count(self, name: str, amount: int = 1) -> None:
        if amount:
            self.stats.counts[name] += amount
            self._unflushed[name] += amount

    def _flush_counters(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._counters_flushed < 2.0:
            return
        self._counters_flushed = time.monotonic()
        deltas, self._unflushed = self._unflushed, Counter()
        try:
            self.store.add_counters({COUNTER_PREFIX + k: v for k, v in deltas.items()})
        except Exception:
            log.exception("cannot save the ingestion counters")
