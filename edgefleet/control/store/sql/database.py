"""The database layer every repository writes through: a connection seen as `Db`, the few dialect differences,
and `Database`, which hands out read connections and write transactions and retries a unit of work that a
lost connection interrupted.

The repositories' queries are written once, with `?` placeholders, in SQL that SQLite 3.35+ and PostgreSQL both
run; a database (`sqlite.SqliteDatabase`, `postgres.PostgresDatabase`) supplies the connections (and turns `?`
into its own placeholder) and a `Dialect` for the rest. Each public repository method is one unit of work
(`@unit_of_work`): on PostgreSQL a unit that fails on a connection problem, a deadlock or a serialization
conflict runs again, whole, on a fresh connection.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar


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

    def insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], conflict: str) -> int:
        """Insert many rows at once (`conflict`: the `ON CONFLICT ...` clause); how many were inserted. SQLite
        runs one prepared statement per row; PostgreSQL copies them (`COPY`) into a staging table first."""
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

T = TypeVar("T")


class Database(Protocol):
    """Connections to one store, shared by its repositories. Thread-safe."""

    url: str
    dialect: Dialect

    def read(self) -> contextlib.AbstractContextManager[Db]:
        """A connection for queries (autocommit)."""
        ...

    def tx(self, snapshot: bool = False) -> contextlib.AbstractContextManager[Db]:
        """One write transaction, committed when the block ends and rolled back if it raises. `snapshot`: every
        statement sees the same snapshot (what compaction needs while ingestion keeps inserting)."""
        ...

    def retrying(self, work: Callable[[], T], name: str, patient: bool) -> T:
        """Run one unit of work; where the database can lose a connection, run it again on a fresh one until it
        succeeds or the retry time is up (`patient=False`: never again)."""
        ...

    def close(self) -> None: ...


class HasDatabase(Protocol):
    @property
    def db(self) -> Database: ...


P = ParamSpec("P")
R = TypeVar("R")
Repo = TypeVar("Repo", bound=HasDatabase)


def unit_of_work(
    patient: bool = True,
) -> Callable[[Callable[Concatenate[Repo, P], R]], Callable[Concatenate[Repo, P], R]]:
    """A repository method that is one unit of work (a read, or a write transaction), retried whole by its
    database (`patient=False`: a lease renewed late is no renewal; the caller tries again on its next tick)."""

    def wrap(method: Callable[Concatenate[Repo, P], R]) -> Callable[Concatenate[Repo, P], R]:
        @functools.wraps(method)
        def call(self: Repo, *args: P.args, **kwargs: P.kwargs) -> R:
            return self.db.retrying(lambda: method(self, *args, **kwargs), method.__name__, patient)

        return call

    return wrap


BATCH_ROWS = 5000  # rows per transaction when compaction deletes or moves rows


def delete_batched(db: Database, table: str, cond: str, bound: float, batch_rows: int | None = None) -> int:
    """Delete the rows of `table` matching `cond` (one `?`: `bound`), at most `batch_rows` per transaction, so
    ingestion keeps writing in between."""
    rows = batch_rows or BATCH_ROWS
    sql = db.dialect.batch_delete.format(table=table, cond=cond)
    total = 0
    while True:
        with db.tx() as conn:
            deleted = conn.execute(sql, (bound, rows)).rowcount
        total += deleted
        if deleted < rows:
            return total


def device_window(
    table: str, columns: str, device_id: str, since: float, until: float | None, bundle_id: str | None,
    slot: str | None = None,
) -> tuple[str, list[Any]]:  # fmt: skip
    """The query for one device's rows of `table` in [since, until), optionally of one bundle and one slot, oldest
    first."""
    sql = f"SELECT {columns} FROM {table} WHERE device_id = ? AND ts >= ?"
    params: list[Any] = [device_id, since]
    if until is not None:
        sql += " AND ts < ?"
        params.append(until)
    if bundle_id is not None:
        sql += " AND bundle_id = ?"
        params.append(bundle_id)
    if slot is not None:
        sql += " AND slot = ?"
        params.append(slot)
    return sql + " ORDER BY ts", params
