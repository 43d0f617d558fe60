"""A host that stores device reports and acknowledges storage as the core contract says, for agent tests.

It stands in for the control plane's ingestion (built on the control side), speaking only the core contract: a
persistent-session subscriber (the broker queues QoS 1 reports for it while it is down, and drops what exceeds
its queue) that "stores" each report's sequence number and publishes, retained, `StoredUpTo(highest contiguous
sequence)` on the device's `stored` topic. A `reports-dropped` event's `dropped_through` counts as accounted for.
It records when each report arrived, so a test can tell a report first heard through a re-send from the rest, and
a re-send of something already acknowledged.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from edgefleet.core.messages import Event, StoredUpTo, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics


@dataclass
class DeviceLedger:
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # (seq, when), every delivery
    stored: set[int] = field(default_factory=set)
    lost_through: int = 0  # announced by reports-dropped
    acknowledged: list[tuple[int, float]] = field(default_factory=list)  # (up_to, when published)

    def contiguous(self) -> int:
        up_to = self.lost_through
        while up_to + 1 in self.stored or up_to + 1 <= self.lost_through:
            up_to += 1
        return up_to

    def caught_up(self, at_least: int) -> bool:
        """Every number up to the highest heard is stored or announced lost, and that is at least `at_least`."""
        highest = max((seq for seq, _ in self.arrivals), default=0)
        return highest >= at_least and self.contiguous() >= highest

    def filled_late(self) -> list[int]:
        """Numbers first heard after a higher one: the gaps a re-send closed."""
        seen: set[int] = set()
        highest, late = 0, []
        for seq, _ in self.arrivals:
            if seq not in seen and seq < highest:
                late.append(seq)
            seen.add(seq)
            highest = max(highest, seq)
        return late

    def resent_after_ack(self, grace_s: float) -> list[int]:
        """Numbers delivered again more than `grace_s` after an acknowledgement covering them was published."""
        bad = []
        for seq, when in self.arrivals:
            covering = [at for up_to, at in self.acknowledged if up_to >= seq]
            if covering and when > min(covering) + grace_s:
                bad.append(seq)
        return bad


class StoringHost:
    def __init__(self, url: str, topics: Topics, client_id: str = "test-storing-host") -> None:
        self.url, self.topics, self.client_id = url, topics, client_id
        self.devices: dict[str, DeviceLedger] = {}
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    def start(self) -> StoringHost:
        """Connect (again) with the same persistent session: what the broker queued meanwhile arrives now."""
        conn = Connection(self.url, self.client_id, protocol="5", session_expiry_s=3600).start()
        conn.subscribe(self.topics.all_events(), self._on_event)
        conn.subscribe(self.topics.all_telemetry(), self._on_telemetry)
        self._conn = conn
        return self

    def stop(self) -> None:
        """Down: the broker keeps the session and queues (up to its limit) what the devices report meanwhile."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.stop()

    def ledger(self, device_id: str) -> DeviceLedger:
        with self._lock:
            return self.devices.setdefault(device_id, DeviceLedger())

    def _on_telemetry(self, topic: str, payload: bytes, retained: bool) -> None:
        report = decode(Telemetry, payload)
        self._store(report.device_id, report.seq, None)

    def _on_event(self, topic: str, payload: bytes, retained: bool) -> None:
        event = decode(Event, payload)
        self._store(event.device_id, event.seq, event.dropped_through)

    def _store(self, device_id: str, seq: int, lost_through: int | None) -> None:
        now = time.monotonic()
        with self._lock:
            ledger = self.devices.setdefault(device_id, DeviceLedger())
            ledger.arrivals.append((seq, now))
            before = ledger.contiguous()
            ledger.stored.add(seq)
            if lost_through:
                ledger.lost_through = max(ledger.lost_through, lost_through)
            after = ledger.contiguous()
            if after > before:
                ledger.acknowledged.append((after, now))
        conn = self._conn
        if after > before and conn is not None:
            message = StoredUpTo(device_id=device_id, up_to=after)
            conn.publish(self.topics.stored(device_id), message.encode(), qos=1, retain=True)
