"""The SQLite database: one file, WAL journal, a small pool of connections (readers never block the writer).

Several control-plane processes on one machine may share the file: writes are short transactions,
`busy_timeout` waits out the other writer, and deduplication lives in UNIQUE constraints. The schema is
`migrations/sqlite/`. A unit of work is never retried: the busy timeout already waits for the lock.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from edgefleet.control.store.errors import StoreError
from edgefleet.control.store.sql.database import SQLITE, Cursor, Db
from edgefleet.control.store.sql.migrate import migrate
from edgefleet.control.store.url import redacted

log = logging.getLogger(__name__)

_POOL_SIZE = 8
T = TypeVar("T")


class _SqliteDb:
    """A sqlite3 connection seen as `Db`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return self.conn.executemany(sql, rows).rowcount

    def insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], conflict: str) -> int:
        # One prepared statement per row is as fast as multi-row VALUES in SQLite (bench/store_layer.py).
        marks = ", ".join("?" for _ in columns)
        return self.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) {conflict}", rows)


class SqliteDatabase:
    dialect = SQLITE

    def __init__(self, path: Path, url: str, busy_timeout_s: float = 30.0) -> None:
        """`busy_timeout_s`: how long a write waits for another process's write lock before it fails."""
        self.url, self.path, self.busy_timeout_s = url, path, busy_timeout_s
        self._pool: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            first = self._connect()
            self._all.append(first)
            self._pool.put(first)
            for step in migrate("sqlite", self.tx, url):
                log.info("store %s: schema migrated to version %d (%s)", redacted(url), step.version, step.name)
        except (OSError, sqlite3.Error) as err:
            self.close()
            raise StoreError(f"cannot open the store {redacted(url)}: {err}") from err

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        return db

    @contextlib.contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        try:
            db = self._pool.get_nowait()
        except queue.Empty:
            with self._lock:
                if self._closed:
                    raise StoreError(f"the store {redacted(self.url)} is closed") from None
                db = self._connect()
                self._all.append(db)
        try:
            yield db
        finally:
            with self._lock:  # a store closed while this one was in use: close it now, nobody else holds it
                retire = self._closed or self._pool.qsize() >= _POOL_SIZE
                if retire:
                    self._all.remove(db)
                else:
                    self._pool.put(db)
            if retire:
                db.close()

    @contextlib.contextmanager
    def read(self) -> Iterator[Db]:
        with self._conn() as conn:
            yield _SqliteDb(conn)

    @contextlib.contextmanager
    def tx(self, snapshot: bool = False) -> Iterator[Db]:
        """BEGIN IMMEDIATE: take the file's one write lock up front (no upgrade deadlocks; a snapshot as well)."""
        with self._conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteDb(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def retrying(self, work: Callable[[], T], name: str, patient: bool) -> T:
        return work()

    def close(self) -> None:
        """Close the idle connections now; one in use by another thread (a loop a stop could not join, a dashboard
        request) is closed when that thread hands it back. Closing a sqlite3 connection under a running statement
        frees the statement it is stepping: the other thread then reads freed memory and the process crashes."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    db = self._pool.get_nowait()
                except queue.Empty:
                    break
                self._all.remove(db)
                db.close()
