"""The evidence repository: what a rollout weighs a device's word against (rollout/judge/plausibility.py).

Schema (`migrations/<dialect>/0006_rollout_evidence.sql`):
- `bundle_facts`: each published bundle's facts (JSON, `rollout.judge.bundle_facts.BundleFacts`: its chunks on
  the wire, its measured latency, its golden score bands), recorded when the host publishes it; the latest wins.
- `link_counters`: each report's link counters (the agent's bundle bytes received and its monotonic clock) with
  the host's receive time, deduplicated like `telemetry` by (device_id, seq, ts).

"committed" events are read from `events` with the host's receive time: when the host learned of a commit, not
when the device says it happened.

Link counters are written by `add_in`, inside the transaction that stores the reports (the reports repository
calls it), and live as long as raw reports (`expire`, from compaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from edgefleet.control.store.records import LinkSample
from edgefleet.control.store.sql.database import Database, Db, delete_batched, unit_of_work
from edgefleet.core.messages import Telemetry

MAX_COMMITS = 10_000  # "committed" events read per device, at most


class Evidence(Protocol):
    """Bundle facts, link counters and commits, as the host received them."""

    def put_bundle_facts(self, bundle_id: str, facts: str, recorded_at: float) -> None:
        """Record a published bundle's facts (JSON); the latest wins."""

    def bundle_facts(self, bundle_id: str) -> str | None: ...

    def link_samples(self, device_id: str, received_since: float) -> list[LinkSample]:
        """The device's link counters received since then (host clock), oldest first."""

    def commits(self, device_id: str) -> list[tuple[str, float]]:
        """(bundle id, received at) of every "committed" event the device sent, oldest first (host clock)."""


class SqlEvidence:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add_in(self, conn: Db, reports: Sequence[Telemetry], received_at: float) -> None:
        """The link counters of the reports that carry them, in the caller's (the reports') transaction."""
        rows = [
            (t.device_id, t.seq or None, t.ts, t.link.bulk_bytes, t.link.clock_s, received_at)
            for t in reports
            if t.link is not None
        ]
        if rows:
            conn.executemany(
                "INSERT INTO link_counters (device_id, seq, ts, bulk_bytes, clock_s, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                rows,
            )

    def expire(self, reports_before: float) -> None:
        """Link counters live as long as raw reports (compaction calls it)."""
        delete_batched(self.db, "link_counters", "ts < ?", reports_before)

    @unit_of_work()
    def put_bundle_facts(self, bundle_id: str, facts: str, recorded_at: float) -> None:
        with self.db.tx() as conn:
            conn.execute(
                "INSERT INTO bundle_facts (bundle_id, facts, recorded_at) VALUES (?, ?, ?)"
                " ON CONFLICT (bundle_id) DO UPDATE SET facts = excluded.facts, recorded_at = excluded.recorded_at",
                (bundle_id, facts, recorded_at),
            )

    @unit_of_work()
    def bundle_facts(self, bundle_id: str) -> str | None:
        with self.db.read() as conn:
            row = conn.execute("SELECT facts FROM bundle_facts WHERE bundle_id = ?", (bundle_id,)).fetchone()
        return str(row[0]) if row else None

    @unit_of_work()
    def link_samples(self, device_id: str, received_since: float) -> list[LinkSample]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT received_at, bulk_bytes, clock_s FROM link_counters WHERE device_id = ? AND received_at >= ?"
                " ORDER BY received_at, ts",
                (device_id, received_since),
            ).fetchall()
        return [LinkSample(float(r[0]), int(r[1]), float(r[2])) for r in rows]

    @unit_of_work()
    def commits(self, device_id: str) -> list[tuple[str, float]]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT bundle_id, received_at FROM events WHERE device_id = ? AND kind = 'committed'"
                f" AND bundle_id IS NOT NULL AND received_at IS NOT NULL ORDER BY received_at LIMIT {MAX_COMMITS}",
                (device_id,),
            ).fetchall()
        return [(str(r[0]), float(r[1])) for r in rows]


__all__ = ["Evidence", "SqlEvidence"]
