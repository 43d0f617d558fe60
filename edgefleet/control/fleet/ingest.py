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
- Nothing acknowledged is lost: the connection acknowledges (PUBACK) a message only after the store committed
  the batch holding it (`Connection(manual_ack=True)`). A failing store is retried with back-off, and while
  it fails nothing is acknowledged: the broker stops sending once its in-flight window is full and queues the
  rest (the back-pressure), devices keep their own spools, and a process that stops meanwhile leaves the
  messages unacknowledged in its persistent session, to be re-delivered. A message the store refuses while it
  takes others (a poison message) is written alone, then rejected, logged and counted, never left to block.
- What is stored is acknowledged to the device: after each batch, every device whose highest contiguous stored
  sequence number moved gets it, retained, on its `stored` topic (`StoredUpTo`, at most once a second per
  device); the store computes it across instances (`stored_through`), so it holds with shared subscriptions.
- Every message crosses the trust boundary first (`admission.py`): a per-device budget of messages and bytes
  (the excess dropped, counted, and a `device-over-budget` alert), a size cap, identifiers checked against
  their grammar and free text cut; what is stored is the admitted copy.
- A malformed message, telemetry from a device the registry does not know, or a payload whose device id
  differs from its topic's is counted, logged (once a minute per device) and dropped; nothing stops ingestion.
  A report refused only for a number outside its bounds (non-finite, negative, past its range, dated far from
  the time received: edgefleet/core/messages.py and admission.py) is counted apart, as `out_of_range`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from pydantic import ValidationError

from edgefleet.control.fleet.admission import Admission, AdmissionError
from edgefleet.control.health import INGEST, INGEST_INTERVAL_S, LoopHealth
from edgefleet.control.store import AlertRecord, Store
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus, Event, M, MessageError, StoredUpTo, Telemetry, decode
from edgefleet.core.mqtt.connection import Ack, AckedHandler, Connection
from edgefleet.core.topics import Topics, check_segment
from edgefleet.core.untrusted import safe_text

log = logging.getLogger(__name__)

COUNTER_PREFIX = "ingest."
_LOG_EVERY_S = 60.0
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 2.0
_GIVE_UP_AFTER_STOP_S = 5.0
_ONE_BY_ONE_AFTER = 3
_BATCH_GAP_S = 0.02
ACK_EVERY_S = 1.0  # a device's StoredUpTo is published at most this often (it is retained: the latest counts)
INGEST_IN_FLIGHT = 2000  # unacknowledged messages the broker may send us (MQTT 5 Receive Maximum)

Item = tuple[str, str, bytes, float, Ack]  # (kind, topic, payload, received at, acknowledge)


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
        admission: Admission | None = None,
        batch_max: int = 2000,
        flush_s: float = 0.2,
        queue_max: int = 200_000,
        health: LoopHealth | None = None,
    ) -> None:
        """`health`: this writer's record (edgefleet/control/health.py): it completes when a batch is stored or
        nothing waits, and fails when the store fails a batch."""
        self.conn, self.topics, self.store = conn, topics, store
        self.share_group = share_group
        self.admission = admission or Admission()  # the trust boundary: budgets, grammar, caps (admission.py)
        self.batch_max, self.flush_s = batch_max, flush_s
        self.stats = IngestStats()
        self.health = health or LoopHealth(INGEST, INGEST_INTERVAL_S)
        self._writing: list[Item] = []  # the batch being stored (the writer thread's)
        self._inbox: queue.Queue[Item] = queue.Queue(maxsize=queue_max)
        self._known: set[str] = set()
        self._known_refreshed = 0.0
        self._logged: dict[tuple[str, str], float] = {}
        self._unflushed: Counter[str] = Counter()
        self._acks_due: dict[str, int] = {}  # device → the StoredUpTo it is owed (written by the writer thread only)
        self._acks_sent: dict[str, float] = {}
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
        self.conn.subscribe_acked(status, self._on("status"))
        self.conn.subscribe_acked(telemetry, self._on("telemetry"))
        self.conn.subscribe_acked(events, self._on("events"))
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
            self.conn.subscribe_acked(self.topics.all_telemetry(), self._on("telemetry"))
            self.conn.subscribe_acked(self.topics.all_events(), self._on("events"))
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

    def _on(self, kind: str) -> AckedHandler:
        def handler(topic: str, payload: bytes, retained: bool, ack: Ack) -> None:
            self._inbox.put((kind, topic, payload, time.time(), ack))

        return handler

    # --- writer thread
    def backlog(self) -> tuple[int, float]:
        """(messages received and not yet stored, seconds the oldest of them has waited) in this process. The
        broker holds more behind them once `INGEST_IN_FLIGHT` are unacknowledged; those are not counted here."""
        now = time.time()
        writing = self._writing
        with self._inbox.mutex:
            queued = len(self._inbox.queue)
            head = self._inbox.queue[0][3] if queued else None
        oldest = writing[0][3] if writing else head
        return len(writing) + queued, (now - oldest) if oldest is not None else 0.0

    def _run(self) -> None:
        while not self._stop.is_set() or not self._inbox.empty():
            batch = self._collect()
            if not batch:
                self._idle.set()
                self.health.ticked(time.time())
                self._flush_counters()
                self._acknowledge_stored()
                continue
            self._writing = batch
            try:
                if not self._commit(batch):
                    break
            finally:
                self._writing = []
            self.health.ticked(time.time())
            self._flush_counters()
            self._acknowledge_stored()

    def _acknowledge_stored(self) -> None:
        """Publish, retained, each device's `StoredUpTo` that moved (at most one per device every `ACK_EVERY_S`):
        the broker's PUBACK only said the broker took a report; this says the store has it, and only this lets
        the device drop it from its spool. A publish that fails is tried again on the next round."""
        now = time.monotonic()
        for device_id in [d for d in self._acks_due if now - self._acks_sent.get(d, 0.0) >= ACK_EVERY_S]:
            up_to = self._acks_due[device_id]
            try:
                self.conn.publish(
                    self.topics.stored(device_id), StoredUpTo(device_id=device_id, up_to=up_to).encode(),
                    qos=1, retain=True,
                )  # fmt: skip
            except Exception as err:  # the broker is away: the device keeps its spool until it hears from us
                self._warn("*", "stored", "could not publish what is stored (%s); trying again", err)
                return
            del self._acks_due[device_id]
            self._acks_sent[device_id] = now
            self._count("stored_acks")

    def _commit(self, batch: list[Item]) -> bool:
        """Write the batch, retrying with back-off while the store fails, then acknowledge every message in it.
        After a few failures the messages are written one by one: a message the store refuses while it takes
        others (say, a number too large for it) is rejected loudly instead of holding up everything behind it.
        False when the process stops with the store still failing: the rest stays unacknowledged."""
        delay, failures, stopping_since = _RETRY_FIRST_S, 0, None
        while batch:
            counts: Counter[str] = Counter()
            try:
                self._write(batch, counts)
            except Exception as err:  # the store is busy or broken: keep the batch, wait, try again
                failures += 1
                self._count("store_retries")
                self.health.failed(time.time(), f"the store failed a batch of {len(batch)} messages: {err}")
                if failures == 1:
                    log.warning("the store failed a batch of %d messages (%s); retrying, nothing is acknowledged "
                                "until it is stored", len(batch), err)  # fmt: skip
                else:
                    self._warn("*", "store", "the store still fails (%d tries): %s", failures, err)
                if failures >= _ONE_BY_ONE_AFTER:
                    batch = self._one_by_one(batch)
                    if not batch:
                        break
            else:
                self._done(batch, counts)
                break
            if self._stop.is_set():
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > _GIVE_UP_AFTER_STOP_S:
                    left = len(batch) + self._inbox.qsize()
                    log.error("stopping with %d messages not stored and not acknowledged: the broker keeps them "
                              "for this instance's session", left)  # fmt: skip
                    self._count("unacknowledged_at_stop", left)
                    return False
            time.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)
        if failures:
            log.info("the store took the batch after %d failed tries", failures)
        return True

    def _done(self, batch: list[Item], counts: Counter[str]) -> None:
        for name, amount in counts.items():
            self._count(name, amount)
        for item in batch:
            item[4]()

    def _one_by_one(self, batch: list[Item]) -> list[Item]:
        """Write each message alone; return what the store still fails. Only while the store takes writes (a
        counter goes in) is a message that fails alone, twice, what it refuses: rejected, logged, counted and
        acknowledged. A store that takes nothing is down: the batch waits for it, untouched."""
        if not self._store_writable():
            return batch
        failed: list[Item] = batch
        last_error: Exception | None = None
        for _ in range(2):
            batch, failed = failed, []
            for item in batch:
                counts: Counter[str] = Counter()
                try:
                    self._write([item], counts)
                except Exception as error:
                    failed.append(item)
                    last_error = error
                else:
                    self._done([item], counts)
            if not failed:
                return []
        if not self._store_writable():
            return failed
        for item in failed:
            self._count("rejected")
            log.error("the store refuses a %s message on %s and it is dropped: %s; payload %r", item[0], item[1],
                      last_error, item[2][:300])  # fmt: skip
            item[4]()
        return []

    def _store_writable(self) -> bool:
        try:
            self.store.add_counters({COUNTER_PREFIX + "store_probes": 1})
        except Exception:
            return False
        return True

    def _collect(self) -> list[Item]:
        """Up to `batch_max` messages: all that arrive within `flush_s`, or until a short gap in arrivals (the
        broker sends at most its in-flight window before an acknowledgement, so waiting longer gains nothing)."""
        try:
            first = self._inbox.get(timeout=0.2)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self.flush_s
        while len(batch) < self.batch_max:
            try:
                wait = min(_BATCH_GAP_S, max(0.0, deadline - time.monotonic()))
                batch.append(self._inbox.get(timeout=wait))
            except queue.Empty:
                break
        return batch

    def _write(self, batch: list[Item], counts: Counter[str]) -> None:
        """Decode and store one batch; `counts` gets what happened (kept only once the batch is stored)."""
        statuses: list[DeviceStatus] = []
        telemetry: list[Telemetry] = []
        events: list[Event] = []
        received_at = batch[-1][3]
        alerts: list[AlertRecord] = []
        refused: list[Telemetry | Event] = []  # admitted by no rule: never stored, but accounted for
        for kind, topic, payload, arrived, _ in batch:
            counts["received"] += 1
            device_id = self.topics.device_id_of(topic)
            if device_id is None:
                continue
            if not payload:  # a retained message being deleted (the retained janitor's sweep, a cleared status):
                counts["retained_cleared"] += 1  # the broker hands the empty message on, as MQTT says it must
                continue
            over = self.admission.budget(device_id, len(payload), arrived)
            if over is not None:
                counts[over.replace("-", "_")] += 1
                self._warn(device_id, over, "dropped an %s %s message from %s (%d bytes)", over, kind,
                           safe_text(device_id), len(payload))  # fmt: skip
                if self.admission.alert_due(device_id, arrived):
                    alerts.append(AlertRecord(
                        device_id=device_id, ts=time.time(), kind="device-over-budget", subject="ingest",
                        level="warning", bundle_id=None,
                        detail=f"{kind} message dropped: {over} ({len(payload)} bytes; limits: "
                        f"{self.admission.limits.max_message_bytes} bytes a message, "
                        f"{self.admission.limits.messages_per_s:g} messages and "
                        f"{self.admission.limits.bytes_per_s:g} bytes a second)",
                    ))  # fmt: skip
                continue
            decoded: DeviceStatus | Telemetry | Event | None
            if kind == "status":
                decoded = self._decode(DeviceStatus, payload, device_id, topic, counts)
            elif kind == "telemetry":
                decoded = self._decode(Telemetry, payload, device_id, topic, counts)
            else:
                decoded = self._decode(Event, payload, device_id, topic, counts)
            if decoded is None:
                continue
            try:
                decoded = self.admission.admit(decoded, arrived)
            except AdmissionError as err:
                counts[err.reason] += 1
                self._warn(device_id, err.reason, "refused a %s message from %s (%s): %s", kind,
                           safe_text(device_id), err.reason.replace("_", " "), safe_text(err, 300))  # fmt: skip
                if not isinstance(decoded, DeviceStatus):
                    refused.append(decoded)
                continue
            if isinstance(decoded, DeviceStatus):
                statuses.append(decoded)
                self._known.add(device_id)
                continue
            message: Telemetry | Event = decoded
            if device_id not in self._known and not self._refresh_known(device_id):
                counts["unknown_device"] += 1
                self._warn(device_id, "unknown", "dropped %s from unknown device %s (no status seen)", kind, device_id)
                continue
            if isinstance(message, Telemetry):
                telemetry.append(message)
            else:
                events.append(message)
        self.store.upsert_statuses(statuses, received_at)
        counts["statuses"] += len(statuses)
        stored = self.store.add_telemetry(telemetry, received_at)
        counts["telemetry"] += stored
        stored_events = self.store.add_events(events, received_at)
        counts["events"] += stored_events
        counts["duplicates"] += len(telemetry) - stored + len(events) - stored_events
        # Every report of the batch is in the store now (new or a repeat): what each device may drop from its spool.
        seen: dict[str, list[int]] = {}
        lost: dict[str, int] = {}
        for message in (*telemetry, *events, *refused):
            if message.seq:
                seen.setdefault(message.device_id, []).append(message.seq)
        for event in events:
            if event.dropped_through:
                lost[event.device_id] = max(lost.get(event.device_id, 0), event.dropped_through)
        self.store.add_alerts(alerts, received_at)
        for device_id, up_to in self.store.stored_through(seen, lost, received_at).items():
            self._acks_due[device_id] = max(up_to, self._acks_due.get(device_id, 0))

    def _decode(self, kind: type[M], payload: bytes, device_id: str, topic: str, counts: Counter[str]) -> M | None:
        try:
            message = decode(kind, payload)
        except MessageError as err:
            reason = "out_of_range" if _out_of_range(err) else "malformed"
            counts[reason] += 1
            self._warn(device_id, reason, "dropped a %s message on %s: %s", reason.replace("_", " "),
                       safe_text(topic), safe_text(err, 300))  # fmt: skip
            return None
        named = getattr(message, "device_id", None)
        if named != device_id:
            counts["mismatched"] += 1
            self._warn(device_id, "mismatched", "dropped a message on %s that names device %s", safe_text(topic),
                       safe_text(named))  # fmt: skip
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
        except Exception as err:
            self._unflushed.update(deltas)  # kept for the next flush
            self._warn("*", "counters", "cannot save the ingestion counters (kept for later): %s", err)


# pydantic's error types of a number outside its bounds (edgefleet.core.messages: MAX_*, finite floats)
_RANGE_ERRORS = frozenset({
    "finite_number", "greater_than", "greater_than_equal", "less_than", "less_than_equal",
})  # fmt: skip


def _out_of_range(err: MessageError) -> bool:
    """Whether a report was refused only for numbers outside their bounds (counted apart from malformed JSON)."""
    cause = err.__cause__
    return isinstance(cause, ValidationError) and all(e["type"] in _RANGE_ERRORS for e in cause.errors())
