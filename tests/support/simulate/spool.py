"""The agent's report spool and re-send policy, in memory, for simulated devices.

The real agent (agent/telemetry/spool.py and reporter.py) writes every report to a bounded disk outbox under the
next number of its one sequence, sends it, and keeps it until the control plane's retained `StoredUpTo` covers it;
a report the broker acknowledged that is still not covered after `resend_after_s` is sent again, lowest number
first, at most `resend_per_s` a second (a token bucket); a full outbox drops its oldest records, counts them, and
the device then says which numbers will never come (a `reports-dropped` event with `dropped_through`). Until the
device has seen one `StoredUpTo` (a control plane that predates them), a PUBACK deletes a record.

`MemorySpool` keeps the same rules for a simulated device, without SQLite and without a thread: the device calls
`flush(now)` where the agent's flush thread would wake (a new report, a storage acknowledgement, the broker back,
at least once a second) and publishes what it returns, in order. One difference comes from the simulator being
asynchronous: the agent waits for each PUBACK before the next publish, a simulated device publishes a batch and
marks each record sent when its PUBACK arrives (`acked`); a record in flight is not offered again meanwhile, and a
lost connection puts it back (`disconnected`), as a publish that failed leaves an agent's record unsent.
tests/unit/bench/test_sim_spool.py drives this class and the agent's `Spool` with the same steps.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class ResendPolicy:
    """The agent's spool bound and re-send rules (its defaults: `ResendPolicy.agent_defaults()`)."""

    max_records: int = 10_000
    resend_after_s: float = 30.0
    resend_per_s: float = 50.0
    unsent_batch: int = 50  # the agent's `Spool.unsent` limit: new reports sent per round of its flush loop
    storage_acks_known: bool = True  # the device has seen a `StoredUpTo` before (a fleet that has been running)

    @classmethod
    def agent_defaults(cls, *, storage_acks_known: bool = True) -> ResendPolicy:
        """The rules of an agent started with its default configuration (read from `AgentConfig`)."""
        from edgefleet.agent.daemon.config import AgentConfig  # the agent's defaults, not a copy of them

        fields = AgentConfig.model_fields
        return cls(
            max_records=int(fields["spool_max_records"].default),
            resend_after_s=float(fields["report_resend_after_s"].default),
            resend_per_s=float(fields["report_resend_per_s"].default),
            storage_acks_known=storage_acks_known,
        )


@dataclass
class Spooled:
    seq: int
    kind: str  # "telemetry" or "event"
    topic: str
    payload: bytes
    first_sent: float | None = None  # when it was first published (the delay to stored counts from here)
    sent: float | None = None  # when the broker last acknowledged it (PUBACK); None: never
    in_flight: bool = False
    sends: int = 0


class MemorySpool:
    """One simulated device's outbox (see the module's docstring). Times are passed in (`now`, seconds)."""

    def __init__(self, policy: ResendPolicy) -> None:
        self.policy = policy
        self.records: OrderedDict[int, Spooled] = OrderedDict()  # by sequence number, which only grows
        self._unsent: dict[int, Spooled] = {}  # never taken by the broker and not in flight, by number
        self.acknowledges_storage = policy.storage_acks_known
        self.stored_up_to = 0
        self.dropped = 0
        self.dropped_through = 0
        self.announced_dropped_through = 0
        self.resent = 0
        self._tokens = policy.resend_per_s
        self._refilled: float | None = None

    # --- writing
    def put(self, seq: int, kind: str, topic: str, payload: bytes) -> list[Spooled]:
        """Spool a report; a full spool drops its oldest records, which are returned."""
        self.records[seq] = self._unsent[seq] = Spooled(seq, kind, topic, payload)
        dropped: list[Spooled] = []
        while len(self.records) > self.policy.max_records:
            _, oldest = self.records.popitem(last=False)
            self._unsent.pop(oldest.seq, None)
            dropped.append(oldest)
        if dropped:
            self.dropped += len(dropped)
            self.dropped_through = max(self.dropped_through, max(r.seq for r in dropped))
        return dropped

    # --- sending
    def flush(self, now: float) -> list[Spooled]:
        """What the agent's flush loop publishes now, in order: the re-sends due (as many as the rate allows),
        then every report the broker has not taken. Each is marked in flight until `acked` or `disconnected`."""
        batch = self._due(now) + self.unsent()
        self._unsent = {}
        for record in batch:
            record.in_flight = True
            record.sends += 1
            if record.first_sent is None:
                record.first_sent = now
            elif record.sent is not None:
                self.resent += 1
        return batch

    def unsent(self) -> list[Spooled]:
        """Reports the broker has not taken and that are not in flight, lowest number first."""
        return list(self._unsent.values())

    def _due(self, now: float) -> list[Spooled]:
        if not self.acknowledges_storage:
            return []
        if self._refilled is not None:
            refill = (now - self._refilled) * self.policy.resend_per_s
            self._tokens = min(self.policy.resend_per_s, self._tokens + refill)
        self._refilled = now
        if self._tokens < 1:
            return []
        limit, before = int(self._tokens), now - self.policy.resend_after_s
        due: list[Spooled] = []
        for record in self.records.values():  # lowest number first
            if len(due) >= limit:
                break
            if record.sent is not None and record.sent < before and not record.in_flight:
                due.append(record)
        self._tokens -= len(due)
        return due

    def acked(self, seq: int, now: float) -> bool:
        """The broker acknowledged this report (PUBACK); True the first time it did. Before the device knows
        storage acknowledgements, a PUBACK deletes the record, as the agent's spool does."""
        record = self.records.get(seq)
        if record is None:
            return False
        first = record.sent is None
        record.sent, record.in_flight = now, False
        if not self.acknowledges_storage:
            del self.records[seq]
        return first

    def disconnected(self) -> None:
        """The connection dropped: what was in flight is offered again (unsent, or due as before)."""
        for record in self.records.values():
            if record.in_flight:
                record.in_flight = False
                if record.sent is None:
                    self._unsent[record.seq] = record
        self._unsent = dict(sorted(self._unsent.items()))

    # --- the control plane's acknowledgement
    def stored(self, up_to: int) -> list[Spooled]:
        """Every report with seq <= `up_to` is stored: drop them (returned, for the delay to stored)."""
        self.acknowledges_storage = True
        self.stored_up_to = max(self.stored_up_to, up_to)
        pruned: list[Spooled] = []
        while self.records:
            seq = next(iter(self.records))
            if seq > self.stored_up_to:
                break
            pruned.append(self.records.pop(seq))
            self._unsent.pop(seq, None)
        return pruned

    def drops_to_announce(self) -> int | None:
        """After a full spool dropped reports the host has not stored: the `dropped_through` of the
        `reports-dropped` event the device sends now (then `announced`), or None."""
        if not self.acknowledges_storage or self.dropped_through <= self.announced_dropped_through:
            return None
        if self.dropped_through <= self.stored_up_to:
            self.announced_dropped_through = self.dropped_through  # nothing missing: nothing to say
            return None
        return max(self.dropped_through, self.next_to_drop())  # the event pushes out one more: it names it too

    def next_to_drop(self) -> int:
        """The number the next `put` drops to make room (0: none), as the agent's `Spool.next_to_drop`."""
        if len(self.records) < self.policy.max_records:
            return 0
        return next(iter(self.records))

    def announced(self, through: int) -> None:
        self.announced_dropped_through = max(self.announced_dropped_through, through)

    # --- figures
    def depth(self) -> int:
        return len(self.records)

    def spooled(self, kind: str | None = None) -> list[int]:
        return [r.seq for r in self.records.values() if kind is None or r.kind == kind]


__all__ = ["MemorySpool", "ResendPolicy", "Spooled"]
