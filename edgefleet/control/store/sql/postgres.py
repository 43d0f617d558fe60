"""The PostgreSQL database: psycopg 3 with a connection pool (psycopg-pool).

`postgresql://user:password@host:5432/edgefleet?pool_size=8&retry_s=60&idle_tx_s=5` (any libpq parameter besides).
The password need not be in the URL (store/url.py): `?password_file=PATH`, or libpq's PGPASSWORD / PGPASSFILE; a URL
is shown with its password redacted wherever it is printed.
Several control-plane instances on several machines share one database: deduplication is in UNIQUE
constraints, rows are locked in a fixed order, leases carry fencing tokens, and migrations take an
advisory lock. A lost connection (a database restart, a failover) is not an error the caller sees: every
repository call is one unit of work (a transaction or a read), and a unit that fails on a connection problem,
a deadlock or a serialization conflict is retried on a fresh connection for up to `retry_s` seconds, so
ingestion waits for the database to come back instead of dropping what it received. Retried writes are
idempotent (upserts, `ON CONFLICT DO NOTHING`), except counters, which may count a retried batch twice.

A stalled instance (SIGSTOP, a VM paused, a machine swapping) must not hold locks while it is stalled: a fenced
write holds the lease row FOR SHARE, and a takeover waits for it. So the server ends any session of ours that
sits idle inside a transaction for `idle_tx_s` seconds (PostgreSQL's idle_in_transaction_session_timeout); the
stalled instance's write is rolled back, its retry is refused by the fence, and it steps down.

Many rows are inserted with `COPY` into a per-session staging table and one `INSERT ... SELECT ... ON CONFLICT`
(0.68× the time of a pipelined `executemany` for 2,000 reports: bench/store_layer.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from edgefleet.control.store.errors import StoreError
from edgefleet.control.store.sql.database import POSTGRESQL, Cursor, Db
from edgefleet.control.store.sql.migrate import migrate
from edgefleet.control.store.url import PASSWORD_FILE, password_from_file, redacted

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x6564_6766  # "edgf": pg_advisory_xact_lock key that serializes migrations
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
T = TypeVar("T")


class _PgDb:
    """A psycopg connection seen as `Db` (`?` placeholders become `%s`)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self.conn.execute(sql.replace("?", "%s"), params)  # our SQL, never user text

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        with self.conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), rows)
            return cur.rowcount

    def insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], conflict: str) -> int:
        if not rows:
            return 0
        if not _NAME.match(table) or not all(_NAME.match(c) for c in columns):
            raise ValueError(f"not a plain table or column name: {table} {columns}")
        stage = f"stage_{table}"
        cols = ", ".join(columns)
        self.conn.execute(  # once per session; emptied at every commit
            f"CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {table} WITH NO DATA"
        )
        with self.conn.cursor() as cur:
            with cur.copy(pgsql.SQL(f"COPY {stage} ({cols}) FROM STDIN")) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} {conflict}")
            inserted = cur.rowcount
            cur.execute(f"TRUNCATE {stage}")  # a second batch in the same transaction
        return inserted


class _Options(NamedTuple):
    conninfo: str  # the libpq URL, without our own parameters
    pool_size: int
    retry_s: float  # how long a call retries on a connection problem
    idle_tx_s: float  # the server ends a session idle inside a transaction this long (0: never)


def url_options(url: str) -> _Options:
    """Our own query parameters are taken out of the URL; the rest goes to libpq."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    try:
        size = int(query.pop("pool_size", "8"))
        retry_s = float(query.pop("retry_s", "60"))
        idle_tx_s = float(query.pop("idle_tx_s", "5"))
    except ValueError as err:
        raise StoreError(
            f"store URL {redacted(url)!r}: pool_size must be an integer, retry_s and idle_tx_s numbers"
        ) from err
    if idle_tx_s < 0:
        raise StoreError(f"store URL {redacted(url)!r}: idle_tx_s must be at least 0 (0: no limit)")
    password_file = query.pop(PASSWORD_FILE, None)
    query.setdefault("connect_timeout", "5")
    scheme = "postgresql"
    conninfo = urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))
    if password_file and parts.password is None:
        conninfo = make_conninfo(conninfo, password=password_from_file(password_file, url))
    return _Options(conninfo, max(1, size), retry_s, idle_tx_s)


class PostgresDatabase:
    dialect = POSTGRESQL

    def __init__(self, url: str) -> None:
        self.url = url
        opts = url_options(url)
        conninfo, self.retry_s = opts.conninfo, opts.retry_s
        idle_ms = str(round(opts.idle_tx_s * 1000))

        def configure(conn: psycopg.Connection[Any]) -> None:  # for the session (autocommit: no transaction)
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (idle_ms,))

        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=opts.pool_size,
            kwargs={"autocommit": True},
            configure=configure,
            check=ConnectionPool.check_connection,  # a connection the server dropped is replaced on checkout
            open=False,
            name="edgefleet-store",
            timeout=5.0,  # waiting for a connection; a call that may wait longer retries (retry_s)
        )
        try:
            psycopg.connect(conninfo).close()  # fail fast, with libpq's own words, on a wrong URL or a server down
            self._pool.open(wait=True, timeout=30.0)
            for step in migrate("postgresql", self._locked_tx, url):
                log.info("store %s: schema migrated to version %d (%s)", redacted(url), step.version, step.name)
        except (psycopg.Error, OSError) as err:
            self._pool.close()
            raise StoreError(f"cannot open the store {redacted(url)}: {one_line(err)}") from err

    @contextlib.contextmanager
    def read(self) -> Iterator[Db]:
        if self._pool.closed:
            raise StoreError(f"the store {redacted(self.url)} is closed")
        with self._pool.connection() as conn:
            yield _PgDb(conn)

    @contextlib.contextmanager
    def tx(self, snapshot: bool = False) -> Iterator[Db]:
        if self._pool.closed:
            raise StoreError(f"the store {redacted(self.url)} is closed")
        with self._pool.connection() as conn, conn.transaction():
            if snapshot:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield _PgDb(conn)

    @contextlib.contextmanager
    def _locked_tx(self) -> Iterator[Db]:
        with self.tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            yield db

    def retrying(self, work: Callable[[], T], name: str, patient: bool) -> T:
        deadline = time.monotonic() + (self.retry_s if patient else 0.0)
        delay = 0.1
        while True:
            try:
                return work()
            except psycopg.OperationalError as err:  # includes deadlocks, serialization failures, lost connections
                if self._pool.closed or time.monotonic() + delay > deadline:
                    raise StoreError(f"the store {redacted(self.url)} failed: {one_line(err)}") from err
                log.warning("store %s: %s: %s; retrying in %.1f s", redacted(self.url), name, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        self._pool.close()


def one_line(err: BaseException) -> str:
    """libpq's messages span lines (a hint on the second); the CLI prints errors as one line."""
    return " ".join(str(err).split())


__all__ = ["PostgresDatabase", "one_line", "redacted", "url_options"]
