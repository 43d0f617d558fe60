"""What the agent tells the fleet: the retained status, and events and telemetry spooled and flushed in order.

Every report goes through one `Reporter`, so events and telemetry share one disk spool and one gap-free sequence
(agent/telemetry/spool.py). The status is retained on the broker (the last one is what counts), so it is published
directly and never spooled; events and telemetry are written to the spool first and published, in order, by the
flush thread (`run_flush`).

A report stays in the spool until the control plane has STORED it: `on_stored` takes the retained `StoredUpTo` of
this device's `stored` topic (applied on the flush thread, which prunes the spool up to it). A report the broker
acknowledged that is still not covered after `resend_after_s` is sent again, lowest number first, at most
`resend_per_s` a second; one already covered never is. When a full spool dropped reports, a `reports-dropped`
event says which numbers will never come (`Event.dropped_through`), so the host's contiguous count can move on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.agent.telemetry.spool import Record, Spool
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus, Event, EventKind, MessageError, StoredUpTo, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpoolFigures:
    """What a telemetry message says about the spool itself, and the sequence number it travels under."""

    seq: int
    depth: int
    dropped: int


class Reporter:
    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        device_id: str,
        spool: Spool,
        *,
        resend_after_s: float = 30.0,
        resend_per_s: float = 50.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.conn, self.topics, self.device_id, self.spool = conn, topics, device_id, spool
        self.resend_after_s, self.resend_per_s, self.clock = resend_after_s, resend_per_s, clock
        self._ready = threading.Event()  # something to flush, a storage acknowledgement, or the broker is back
        self._status_lock = threading.Lock()
        self._stored_lock = threading.Lock()
        self._stored_pending: int | None = None  # the highest up_to received, not yet applied to the spool
        self._stored_seen = spool.stored_up_to()  # the highest up_to known: never re-send at or below it
        self._tokens, self._refilled = resend_per_s, time.monotonic()
        self.resent = 0  # reports sent again since start (the broker took them, the host did not store them)

    # --- the retained status
    def publish_status(self, status: DeviceStatus, *, wait: float | None = None) -> None:
        """Retained, QoS 1; skipped while disconnected (the broker's copy is refreshed on every connect)."""
        with self._status_lock:
            if self.conn.connected:
                self.conn.publish_latest(self.topics.status(self.device_id), status.encode(), qos=1, wait=wait)

    # --- spooled reports
    def event(
        self,
        kind: EventKind,
        detail: str,
        *,
        bundle_id: str | None = None,
        progress: float | None = None,
        ts: float | None = None,
        dropped_through: int | None = None,
        slot: str | None = None,
    ) -> bool:
        """Spool an event (`ts`: when it happened, if not now; `slot`: the slot it is about, None: the device's own);
        False when the disk could not take it."""
        log.info("event %s %s %s: %s", kind, slot or "", bundle_id or "", detail)

        def build(seq: int) -> bytes:
            return Event(
                device_id=self.device_id, kind=kind, bundle_id=bundle_id, detail=detail, progress=progress, seq=seq,
                dropped_through=dropped_through, slot=slot, **({"ts": ts} if ts is not None else {}),
            ).encode()  # fmt: skip

        return self._enqueue(self.topics.events(self.device_id), build)

    def for_slot(self, slot: str) -> SlotReporter:
        """The events of one slot: every one carries `slot`."""
        return SlotReporter(self, slot)

    def telemetry(self, build: Callable[[SpoolFigures], Telemetry]) -> bool:
        """Spool the telemetry message `build` makes; False when the disk could not take it."""
        depth, dropped = self.spool.depth(), self.spool.dropped()
        return self._enqueue(
            self.topics.telemetry(self.device_id), lambda seq: build(SpoolFigures(seq, depth, dropped)).encode()
        )

    def _enqueue(self, topic: str, build: Callable[[int], bytes]) -> bool:
        try:
            self.spool.put(topic, build)
        except Exception as err:  # a full disk: the report is not spooled and takes no number (status says why)
            log.error("cannot spool a report for %s: %s", topic, err)
            return False
        self._ready.set()
        return True

    # --- the control plane's acknowledgement (the network thread: record and wake only)
    def on_stored(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            message = decode(StoredUpTo, payload)
        except MessageError as err:
            log.warning("refused a storage acknowledgement on %s: %s", topic, err)
            return
        if message.device_id != self.device_id:
            log.warning("refused a storage acknowledgement on %s: it names another device", topic)
            return
        with self._stored_lock:
            self._stored_pending = max(self._stored_pending or 0, message.up_to)
        self._ready.set()

    def _apply_stored(self) -> None:
        with self._stored_lock:
            up_to, self._stored_pending = self._stored_pending, None
        if up_to is None:
            return
        last = self.spool.last_sequence()
        if up_to > last:
            following = self.spool.renumber_above(up_to)
            log.warning("the control plane stored reports up to %d, but this device numbered only %d (its state was "
                        "reset): its reports are numbered from %d on", up_to, last, following)  # fmt: skip
        self._stored_seen = max(self._stored_seen, up_to)
        pruned = self.spool.stored(up_to)
        if pruned:
            log.debug("%d reports stored by the control plane (up to %d)", pruned, up_to)

    def _announce_drops(self) -> None:
        """After a full spool dropped reports the host has not stored: say which numbers will never come."""
        spool = self.spool
        if not spool.acknowledges_storage():
            return
        through = spool.dropped_through()
        if through <= spool.counter("announced_dropped_through"):
            return
        if through > spool.stored_up_to():
            # The event takes a place in a full spool too: it names the report it pushes out, or each announcement
            # would drop one more report and call for another, as fast as the flush loop turns.
            through = max(through, spool.next_to_drop())
            detail = (f"the report spool was full ({spool.max_records} records): {spool.dropped()} reports dropped "
                      f"so far; those numbered up to {through} and not stored are lost")  # fmt: skip
            if not self.event("reports-dropped", detail, dropped_through=through):
                return
        spool.set_counter("announced_dropped_through", through)

    # --- the flush thread
    def wake(self) -> None:
        """The broker is back, or the agent is stopping: flush (or leave) now instead of at the next tick."""
        self._ready.set()

    def run_flush(self, stop: threading.Event) -> None:
        """Publish spooled reports in order (due re-sends first); delete each once the host stored it (or, before
        the host acknowledges storage, once the broker took it)."""
        while not stop.is_set():
            self._ready.wait(1.0 if self.spool.acknowledges_storage() else 5.0)
            self._ready.clear()
            try:
                self._apply_stored()
                self._announce_drops()
            except Exception:  # a spool that cannot be written (full disk): send what is there anyway
                log.exception("cannot apply the storage acknowledgement")
            while self.conn.connected and not stop.is_set():
                due = self._due()
                batch = due or self.spool.unsent()
                if not batch:
                    break
                if not self._publish(batch, resend=bool(due)):
                    stop.wait(1.0)  # the link is flaky: back off, then retry in order
                    break

    def _due(self) -> list[Record]:
        """Re-sends due now, as many as the rate allows."""
        if not self.spool.acknowledges_storage():
            return []
        now = time.monotonic()
        self._tokens = min(self.resend_per_s, self._tokens + (now - self._refilled) * self.resend_per_s)
        self._refilled = now
        if self._tokens < 1:
            return []
        due = self.spool.due(self.clock() - self.resend_after_s, int(self._tokens))
        self._tokens -= len(due)
        return due

    def _publish(self, batch: list[Record], *, resend: bool) -> bool:
        """Publish `batch` in order, each acknowledged by the broker; False when the broker stopped taking them."""
        sent: list[Record] = []
        try:
            for record in batch:
                if record.seq is not None and record.seq <= self._stored_seen:
                    continue  # stored meanwhile: never sent again (the next acknowledgement prunes it)
                try:
                    self.conn.publish(record.topic, record.payload, qos=1, wait=10.0)
                except (BrokerError, ValueError) as err:
                    log.info("spool flush paused: %s", err)
                    return False
                sent.append(record)
            return True
        finally:
            self.spool.sent(sent, self.clock())
            if len(sent) < len(batch) and self._stored_seen:
                self.spool.stored(self._stored_seen)  # what was skipped as stored goes now
            if resend:
                self.resent += len(sent)

    def close(self) -> None:
        self.spool.close()


__all__ = ["Reporter", "SlotReporter", "SpoolFigures"]


class SlotReporter:
    """A slot's view of the reporter: its events carry the slot (Event.slot)."""

    def __init__(self, reporter: Reporter, slot: str) -> None:
        self.reporter, self.slot = reporter, slot

    def event(
        self,
        kind: EventKind,
        detail: str,
        *,
        bundle_id: str | None = None,
        progress: float | None = None,
        ts: float | None = None,
    ) -> bool:
        return self.reporter.event(kind, detail, bundle_id=bundle_id, progress=progress, ts=ts, slot=self.slot)
