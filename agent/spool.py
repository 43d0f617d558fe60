"""A bounded, disk-backed outbox for telemetry and events (SQLite in the state directory).

Every telemetry report and event is written here first and deleted only after the broker acknowledged
it (QoS 1 PUBACK), so a vanished broker, a reconnect or an agent restart loses nothing. When the outbox
is full the oldest records are dropped, and the drops are counted (persistently) and reported in
telemetry. Records are flushed in insertion order.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    rowid: int
    topic: str
    payload: bytes


class Spool:
    def __init__(self, path: Path, max_records: int = 10_000) -> None:
        self.max_records = max_records
        self._lock = threading.Lock()
        # check_same_thread=False: the lock above serialises every use across threads.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
            " payload BLOB NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, topic: str, payload: bytes) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT INTO outbox (topic, payload) VALUES (?, ?)", (topic, payload))
                (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
                excess = count - self.max_records
                if excess > 0:
                    self._db.execute(
                        "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT ?)", (excess,)
                    )
                    self._bump("dropped", excess)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def next_batch(self, limit: int = 50) -> list[Record]:
        with self._lock:
            rows = self._db.execute("SELECT id, topic, payload FROM outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [Record(int(r[0]), str(r[1]), bytes(r[2])) for r in rows]

    def ack(self, rowids: list[int]) -> None:
        if not rowids:
            return
        with self._lock:
            self._db.executemany("DELETE FROM outbox WHERE id = ?", [(r,) for r in rowids])

    def depth(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)

    def dropped(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
        return int(row[0]) if row else 0

    def next_sequence(self) -> int:
        """A per-device counter that survives restarts: lets the host prove nothing was lost."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._bump("sequence", 1)
                (value,) = self._db.execute("SELECT value FROM counters WHERE name = 'sequence'").fetchone()
                self._db.execute("COMMIT")
            except BaseException:  # e.g. a full disk: leave no transaction open, or every later call fails
                self._db.execute("ROLLBACK")
                raise
        return int(value)

    def _bump(self, name: str, by: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
            (name, by, by),
        )
