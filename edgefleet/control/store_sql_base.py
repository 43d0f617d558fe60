"""What the SQL stores share below the queries: a connection seen as `Db`, the few dialect differences, the base
class that hands out read and write transactions, and the fencing check every rollout-state write runs.

The queries are written once, with `?` placeholders, in SQL that SQLite 3.35+ and PostgreSQL both run; a
backend supplies the connections (and turns `?` into its own placeholder) and a `Dialect` for the rest.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import copy
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from edgefleet.control.store import Fence, FencedOut, Store


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Db(Protocol):
    """One connection inside a transaction (or in autocommit, for reads)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run `sql` once per row; how many rows it changed in all."""
        ...


@dataclass(frozen=True)
class Dialect:
    name: str
    bucket: str  # floor(x / ?) as an integer, with {x} for the column
    greatest: str  # two-argument max / min of scalars
    least: str
    row_id: str  # a physical row id, for batched deletes
    batch_delete: str  # {table}, {rid}, {cond}: delete at most ? rows matching cond
    for_update: str  # suffix that locks the rows a SELECT read in a write transaction
    for_share: str  # suffix that keeps a row from changing until the transaction ends
    insert_order: str  # a column that grows with every insert (ties broken in insertion order)


SQLITE = Dialect(
    name="sqlite",
    bucket="CAST({x} / ? AS INTEGER)",
    greatest="MAX",
    least="MIN",
    row_id="rowid",
    batch_delete="DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {cond} LIMIT ?)",
    for_update="",  # BEGIN IMMEDIATE already holds the database's one write lock
    for_share="",
    insert_order="rowid",
)
POSTGRESQL = Dialect(
    name="postgresql",
    bucket="CAST(FLOOR({x} / ?) AS BIGINT)",
    greatest="GREATEST",
    least="LEAST",
    row_id="ctid",
    batch_delete="DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {cond} LIMIT ?))",
    for_update=" FOR UPDATE",
    for_share=" FOR SHARE",
    insert_order="id",
)


WRITE_MS_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
WRITE_MS_COUNTER = "store.write_ms.le_"  # + a bound (zero-padded) or "inf": a cumulative-free histogram


class WriteTimings:
    """How long telemetry writes took, as histogram buckets; saved with the next `add_counters` (no extra
    transaction), so `counters()` shows every process's store write latency (the fleet bench reads its p95)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}

    def record(self, ms: float) -> None:
        i = bisect.bisect_left(WRITE_MS_BOUNDS, ms)
        name = WRITE_MS_COUNTER + (f"{WRITE_MS_BOUNDS[i]:05d}" if i < len(WRITE_MS_BOUNDS) else "inf")
        with self._lock:
            self._pending[name] = self._pending.get(name, 0) + 1

    def take(self) -> dict[str, int]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending


def device_window(
    table: str, columns: str, device_id: str, since: float, until: float | None, bundle_id: str | None
) -> tuple[str, list[Any]]:
    """The query for one device's rows of `table` in [since, until), optionally of one bundle, oldest first."""
    sql = f"SELECT {columns} FROM {table} WHERE device_id = ? AND ts >= ?"
    params: list[Any] = [device_id, since]
    if until is not None:
        sql += " AND ts < ?"
        params.append(until)
    if bundle_id is not None:
        sql += " AND bundle_id = ?"
        params.append(bundle_id)
    return sql + " ORDER BY ts", params


def write_ms_quantile(counters: dict[str, int], q: float) -> float | None:
    """The q-quantile (upper bucket bound, ms) of the write histogram in `counters` (or a difference of two)."""
    buckets = sorted(
        (k.removeprefix(WRITE_MS_COUNTER), v) for k, v in counters.items() if k.startswith(WRITE_MS_COUNTER)
    )
    total = sum(v for _, v in buckets)
    if total <= 0:
        return None
    seen = 0
    for bound, count in buckets:  # "00001" < ... < "10000" < "inf"
        seen += count
        if seen >= q * total:
            return float(bound) if bound != "inf" else float("inf")
    return float("inf")


class SqlBase(Store, abc.ABC):
    """A store over SQL connections: `_read()` for queries, `_tx()` for one write transaction."""

    dialect: Dialect
    _fence: Fence | None = None
    _owner: bool = True  # False for the fenced views `with_fence` makes: they share and never close the pool

    def __init__(self) -> None:
        self.write_timings = WriteTimings()

    @abc.abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Db]: ...

    @abc.abstractmethod
    def _tx(self, snapshot: bool = False) -> contextlib.AbstractContextManager[Db]:
        """One write transaction, committed when the block ends and rolled back if it raises. `snapshot`: every
        statement sees the same snapshot (what compaction needs while ingestion keeps inserting)."""

    @abc.abstractmethod
    def _close(self) -> None: ...

    def close(self) -> None:
        if self._owner:
            self._close()

    def with_fence(self, fence: Fence) -> Store:
        view = copy.copy(self)
        view._fence, view._owner = fence, False
        return view

    @contextlib.contextmanager
    def _fenced_tx(self) -> Iterator[Db]:
        """A write transaction that first checks this view's fence (if any) and keeps the lease row from changing
        hands until it commits: the write and a takeover are ordered, never interleaved."""
        with self._tx() as db:
            fence = self._fence
            if fence is not None:
                row = db.execute(
                    f"SELECT holder, token FROM leases WHERE name = ?{self.dialect.for_share}", (fence.lease,)
                ).fetchone()
                if row is None or (str(row[0]), int(row[1])) != (fence.holder, fence.token):
                    now = f"{row[0]} (term {row[1]})" if row and row[0] else "nobody"
                    raise FencedOut(
                        f"lease {fence.lease!r} term {fence.token} of {fence.holder} is over (now held by {now}); "
                        "the write was not made"
                    )
            yield db
