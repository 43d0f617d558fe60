"""The health repository: each control-plane instance's loops (the rollout engine, the desired-state sync, the
broker-rights sync) as that instance last wrote them, so another process (`edgefleet control status`, the
dashboard of another instance, /metrics) sees a loop that fails or has stopped ticking.

Schema: `component_health` (`migrations/<dialect>/0006_rollout_evidence.sql`; `active`, `active_since` from 0008);
one row per
(component, holder), replaced by its instance every few seconds (edgefleet/control/health.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from edgefleet.control.store.records import ComponentHealthRow
from edgefleet.control.store.sql.database import Database, unit_of_work

_COLUMNS = (
    "component, holder, interval_s, last_tick, errors_per_min, last_error, last_error_at, active, active_since,"
    " updated_at"
)


class Health(Protocol):
    def put_health(self, rows: Sequence[ComponentHealthRow]) -> None:
        """Replace these rows (one transaction)."""

    def health(self, written_since: float = 0.0) -> list[ComponentHealthRow]:
        """Every row written since then, by component and holder."""

    def forget_health(self, written_before: float) -> int:
        """Drop rows no instance has written since then (instances long gone); returns how many."""

    def drop_health(self, holder: str) -> None:
        """Drop one instance's rows (it stopped cleanly)."""


class SqlHealth:
    def __init__(self, db: Database) -> None:
        self.db = db

    @unit_of_work()
    def put_health(self, rows: Sequence[ComponentHealthRow]) -> None:
        if not rows:
            return
        with self.db.tx() as conn:
            conn.executemany(
                f"INSERT INTO component_health ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (component, holder) DO UPDATE SET interval_s = excluded.interval_s,"
                " last_tick = excluded.last_tick, errors_per_min = excluded.errors_per_min,"
                " last_error = excluded.last_error, last_error_at = excluded.last_error_at,"
                " active = excluded.active, active_since = excluded.active_since, updated_at = excluded.updated_at",
                [
                    (r.component, r.holder, r.interval_s, r.last_tick, r.errors_per_min, r.last_error,
                     r.last_error_at, int(r.active), r.active_since, r.updated_at)
                    for r in rows
                ],
            )  # fmt: skip

    @unit_of_work()
    def health(self, written_since: float = 0.0) -> list[ComponentHealthRow]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM component_health WHERE updated_at >= ? ORDER BY component, holder",
                (written_since,),
            ).fetchall()
        return [
            ComponentHealthRow(r[0], r[1], float(r[2]), r[3], int(r[4]), r[5], r[6], bool(r[7]), r[8], float(r[9]))
            for r in rows
        ]

    @unit_of_work()
    def forget_health(self, written_before: float) -> int:
        with self.db.tx() as conn:
            cursor = conn.execute("DELETE FROM component_health WHERE updated_at < ?", (written_before,))
            return int(cursor.rowcount or 0)

    @unit_of_work()
    def drop_health(self, holder: str) -> None:
        with self.db.tx() as conn:
            conn.execute("DELETE FROM component_health WHERE holder = ?", (holder,))
