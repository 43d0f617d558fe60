"""A bounded, disk-backed outbox for telemetry and events (SQLite in the state directory), and the device's
report sequence.

Every report is written here first, under the next number of one per-device sequence shared by telemetry and
events. The number is taken in the same transaction as the write, so the sequence has no gap: a report the disk
could not take consumes no number. The sequence survives restarts.

A record leaves the outbox when the control plane has STORED it: the retained `StoredUpTo(up_to)` on the device's
`stored` topic (every report with seq <= up_to is stored) prunes it. The broker's PUBACK only marks it sent; a
record sent but not covered is sent again after a while (the broker may have dropped it for a subscriber with a
full queue, or the host was down). Until the device has seen a `StoredUpTo` once (a control plane that predates
them), a PUBACK deletes the record, as before.

When the outbox is full the oldest records are dropped, counted (persistently) and reported in telemetry; the
highest sequence number ever dropped is kept too (`dropped_through`), so the device can tell the host that the
numbers below it that it has not stored will never come.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    rowid: int
    topic: str
    payload: bytes
    seq: int | None  # None: a record without a sequence number (it is deleted once the broker took it)


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
            " payload BLOB NOT NULL, seq INTEGER, sent REAL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self._migrate()
        self._db.execute("CREATE INDEX IF NOT EXISTS outbox_seq ON outbox (seq)")

    def _migrate(self) -> None:
        """An outbox written by an agent before stored acknowledgements: add the columns, and read each record's
        sequence number from its payload (every report carried one)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if {"seq", "sent"} <= columns:
            return
        for column, kind in (("seq", "INTEGER"), ("sent", "REAL")):
            if column not in columns:
                self._db.execute(f"ALTER TABLE outbox ADD COLUMN {column} {kind}")
        for rowid, payload in self._db.execute("SELECT id, payload FROM outbox").fetchall():
            try:
                seq = json.loads(payload).get("seq")
            except (ValueError, AttributeError):
                seq = None
            if isinstance(seq, int) and seq > 0:
                self._db.execute("UPDATE outbox SET seq = ? WHERE id = ?", (seq, rowid))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- writing
    def put(self, topic: str, build: Callable[[int], bytes]) -> int:
        """Spool the report `build(seq)` makes under the next sequence number, in one transaction (a failure
        consumes no number); returns the number. A full outbox drops its oldest records."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._counter("sequence") + 1
                self._set("sequence", seq)
                self._db.execute("INSERT INTO outbox (topic, payload, seq) VALUES (?, ?, ?)", (topic, build(seq), seq))
                (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
                excess = count - self.max_records
                if excess > 0:
                    oldest = self._db.execute("SELECT id, seq FROM outbox ORDER BY id LIMIT ?", (excess,)).fetchall()
                    self._db.executemany("DELETE FROM outbox WHERE id = ?", [(row[0],) for row in oldest])
                    self._bump("dropped", excess)
                    lost = max((row[1] for row in oldest if row[1] is not None), default=0)
                    if lost > self._counter("dropped_through"):
                        self._set("dropped_through", lost)
                self._db.execute("COMMIT")
            except BaseException:  # e.g. a full disk: leave no transaction open, or every later call fails
                self._db.execute("ROLLBACK")
                raise
        return seq

    # --- sending
    def unsent(self, limit: int = 50) -> list[Record]:
        """Records the broker has not taken yet, oldest first."""
        return self._records("WHERE sent IS NULL ORDER BY id LIMIT ?", (limit,))

    def due(self, sent_before: float, limit: int) -> list[Record]:
        """Records the broker took before `sent_before` that the host has not stored, lowest number first."""
        with self._lock:
            above = self._counter("stored_up_to")
        return self._records(
            "WHERE sent IS NOT NULL AND sent < ? AND seq > ? ORDER BY seq LIMIT ?", (sent_before, above, limit)
        )

    def _records(self, where: str, args: tuple[object, ...]) -> list[Record]:
        with self._lock:
            rows = self._db.execute(f"SELECT id, topic, payload, seq FROM outbox {where}", args).fetchall()
        return [Record(int(r[0]), str(r[1]), bytes(r[2]), None if r[3] is None else int(r[3])) for r in rows]

    def sent(self, records: list[Record], at: float) -> None:
        """The broker acknowledged these records (PUBACK). Kept until stored once the host acknowledges storage;
        deleted at once otherwise (and always for a record without a sequence number)."""
        if not records:
            return
        with self._lock:
            if self._counter("stored_acks"):
                keep = [(at, r.rowid) for r in records if r.seq is not None]
                gone = [(r.rowid,) for r in records if r.seq is None]
            else:
                keep, gone = [], [(r.rowid,) for r in records]
            self._db.executemany("UPDATE outbox SET sent = ? WHERE id = ?", keep)
            self._db.executemany("DELETE FROM outbox WHERE id = ?", gone)

    # --- the host's acknowledgement
    def stored(self, up_to: int) -> int:
        """The control plane has stored every report with seq <= `up_to`: drop them; returns how many went. From
        now on a PUBACK no longer deletes a record."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._set("stored_acks", 1)
                if up_to > self._counter("stored_up_to"):
                    self._set("stored_up_to", up_to)
                pruned = self._db.execute("DELETE FROM outbox WHERE seq <= ?", (up_to,)).rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return int(pruned)

    def renumber_above(self, floor: int) -> int:
        """The host says it stored numbers this device never gave (its state was wiped, the id kept): give every
        record still here a number above `floor`, in order, and continue the sequence from there, so no report
        is mistaken for one the host already has. Returns the next number."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute("SELECT id, payload FROM outbox WHERE seq IS NOT NULL ORDER BY id").fetchall()
                seq = max(self._counter("sequence"), floor)
                for rowid, payload in rows:
                    seq += 1
                    document = json.loads(payload)
                    document["seq"] = seq
                    self._db.execute(
                        "UPDATE outbox SET seq = ?, payload = ?, sent = NULL WHERE id = ?",
                        (seq, json.dumps(document, separators=(",", ":")).encode(), rowid),
                    )
                self._set("sequence", seq)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return seq + 1

    # --- figures
    def depth(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)

    def dropped(self) -> int:
        return self.counter("dropped")

    def last_sequence(self) -> int:
        """The number of the last report spooled (0: none yet)."""
        return self.counter("sequence")

    def stored_up_to(self) -> int:
        return self.counter("stored_up_to")

    def next_to_drop(self) -> int:
        """The highest sequence number the next `put` drops to make room (the oldest records of a full outbox);
        0: it drops none."""
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            excess = count + 1 - self.max_records
            if excess <= 0:
                return 0
            rows = self._db.execute("SELECT seq FROM outbox ORDER BY id LIMIT ?", (excess,)).fetchall()
        return max((int(r[0]) for r in rows if r[0] is not None), default=0)

    def dropped_through(self) -> int:
        """The highest sequence number a full outbox ever dropped (0: none)."""
        return self.counter("dropped_through")

    def acknowledges_storage(self) -> bool:
        """Whether the host has ever acknowledged storage (then a PUBACK no longer deletes a record)."""
        return bool(self.counter("stored_acks"))

    def counter(self, name: str) -> int:
        with self._lock:
            return self._counter(name)

    def set_counter(self, name: str, value: int) -> None:
        with self._lock:
            self._set(name, value)

    def _counter(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _set(self, name: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = ?",
            (name, value, value),
        )

    def _bump(self, name: str, by: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
            (name, by, by),
        )


__all__ = ["Record", "Spool"]
