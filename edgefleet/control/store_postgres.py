"""The PostgreSQL store: psycopg 3 with a connection pool (psycopg-pool), the shared SQL of `store_sql*`.

`postgresql://user:password@host:5432/edgefleet?pool_size=8&retry_s=60&idle_tx_s=5` (any libpq parameter besides).
Several control-plane instances on several machines share one database: deduplication is in UNIQUE
constraints, rows are locked in a fixed order, leases carry fencing tokens, and migrations take an
advisory lock. A lost connection (a database restart, a failover) is not an error the caller sees: every
store call is one transaction (or read), and a call that fails on a connection problem, a deadlock or a
serialization conflict is retried on a fresh connection for up to `retry_s` seconds, so ingestion waits
for the database to come back instead of dropping what it received. Retried writes are idempotent
(upserts, `ON CONFLICT DO NOTHING`), except counters, which may count a retried batch twice.

A stalled instance (SIGSTOP, a VM paused, a machine swapping) must not hold locks while it is stalled: a fenced
write holds the lease row FOR SHARE, and a takeover waits for it. So the server ends any session of ours that
sits idle inside a transaction for `idle_tx_s` seconds (PostgreSQL's idle_in_transaction_session_timeout); the
stalled instance's write is rolled back, its retry is refused by the fence, and it steps down.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool

from edgefleet.control.store import Store, StoreError
from edgefleet.control.store_migrate import migrate
from edgefleet.control.store_sql import SqlStore
from edgefleet.control.store_sql_base import POSTGRESQL, Cursor, Db

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x6564_6766  # "edgf": pg_advisory_xact_lock key that serializes migrations
_NOT_WRAPPED = {"close", "with_fence"}
_NOT_RETRIED = {"acquire_lease"}  # a lease renewed late is no renewal: the engine loop tries again on its next tick
F = TypeVar("F", bound=Callable[..., Any])


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


class _Options(NamedTuple):
    conninfo: str  # the libpq URL, without our own parameters
    pool_size: int
    retry_s: float  # how long a call retries on a connection problem
    idle_tx_s: float  # the server ends a session idle inside a transaction this long (0: never)


def _options(url: str) -> _Options:
    """Our own query parameters are taken out of the URL; the rest goes to libpq."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    try:
        size = int(query.pop("pool_size", "8"))
        retry_s = float(query.pop("retry_s", "60"))
        idle_tx_s = float(query.pop("idle_tx_s", "5"))
    except ValueError as err:
        raise StoreError(f"store URL {url!r}: pool_size must be an integer, retry_s and idle_tx_s numbers") from err
    if idle_tx_s < 0:
        raise StoreError(f"store URL {url!r}: idle_tx_s must be at least 0 (0: no limit)")
    query.setdefault("connect_timeout", "5")
    scheme = "postgresql"
    conninfo = urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))
    return _Options(conninfo, max(1, size), retry_s, idle_tx_s)


def _retrying(method: F, patient: bool = True) -> F:
    @functools.wraps(method)
    def call(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + (self.retry_s if patient else 0.0)
        delay = 0.1
        while True:
            try:
                return method(self, *args, **kwargs)
            except psycopg.OperationalError as err:  # includes deadlocks, serialization failures, lost connections
                if self._pool.closed or time.monotonic() + delay > deadline:
                    raise StoreError(f"the store {_redacted(self.url)} failed: {_one_line(err)}") from err
                log.warning("store %s: %s: %s; retrying in %.1f s", self.url, method.__name__, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    return cast(F, call)


class PostgresStore(SqlStore):
    dialect = POSTGRESQL

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        options = _options(url)
        conninfo, self.retry_s = options.conninfo, options.retry_s
        idle_ms = str(round(options.idle_tx_s * 1000))

        def configure(conn: psycopg.Connection[Any]) -> None:  # for the session (autocommit: no transaction)
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (idle_ms,))

        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=options.pool_size,
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
                log.info("store %s: schema migrated to version %d (%s)", _redacted(url), step.version, step.name)
        except (psycopg.Error, OSError) as err:
            self._pool.close()
            raise StoreError(f"cannot open the store {_redacted(url)}: {_one_line(err)}") from err

    @contextlib.contextmanager
    def _read(self) -> Iterator[Db]:
        if self._pool.closed:  # (a fenced view shares the pool: it sees the close too)
            raise StoreError(f"the store {_redacted(self.url)} is closed")
        with self._pool.connection() as conn:
            yield _PgDb(conn)

    @contextlib.contextmanager
    def _tx(self, snapshot: bool = False) -> Iterator[Db]:
        if self._pool.closed:  # (a fenced view shares the pool: it sees the close too)
            raise StoreError(f"the store {_redacted(self.url)} is closed")
        with self._pool.connection() as conn, conn.transaction():
            if snapshot:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield _PgDb(conn)

    @contextlib.contextmanager
    def _locked_tx(self) -> Iterator[Db]:
        with self._tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            yield db

    def _close(self) -> None:
        self._pool.close()


def _one_line(err: BaseException) -> str:
    """libpq's messages span lines (a hint on the second); the CLI prints errors as one line."""
    return " ".join(str(err).split())


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


_PUBLIC = {n for n in dir(Store) if not n.startswith("_") and callable(getattr(Store, n))}
for _name in sorted(_PUBLIC - _NOT_WRAPPED):
    setattr(PostgresStore, _name, _retrying(getattr(SqlStore, _name), patient=_name not in _NOT_RETRIED))
