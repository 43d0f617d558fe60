"""Versioned schema migrations, on both backends: a new store is built by them, an old SQLite file from before
them is adopted and upgraded, a store newer than the code is refused, and instances opening one store at once
migrate it once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from edgefleet.control.store import StoreError, open_store
from edgefleet.control.store.sql.migrate import latest_version, migrations, split_statements

from support.paths import REPO
from support.servers.pg_server import PostgresServer

# The schema the SQLite store created before versioned migrations (no schema_version, no lease tokens).
PRE_MIGRATION_SCHEMA = (REPO / "edgefleet/control/store/sql/migrations/sqlite/0001_initial.sql").read_text()


def _versions_sqlite(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version")]


def test_both_dialects_have_the_same_numbered_migrations() -> None:
    sqlite_steps, pg_steps = migrations("sqlite"), migrations("postgresql")
    assert [(m.version, m.name) for m in sqlite_steps] == [(m.version, m.name) for m in pg_steps]
    assert latest_version("sqlite") >= 2 and all(m.statements for m in sqlite_steps)


def test_statements_are_split_at_line_ends_and_comments_dropped() -> None:
    sql = "-- a comment; not a statement\nCREATE TABLE a (x TEXT DEFAULT ';');\nCREATE INDEX i ON a (x);\n"
    assert split_statements(sql) == ["CREATE TABLE a (x TEXT DEFAULT ';')", "CREATE INDEX i ON a (x)"]


def test_a_sqlite_file_from_before_migrations_is_adopted_and_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(PRE_MIGRATION_SCHEMA)
        db.execute("INSERT INTO leases (name, holder, expires_at) VALUES ('rollout-engine', 'old', 50.0)")
        db.execute("INSERT INTO counters (name, value) VALUES ('ingest.telemetry', 7)")
    store = open_store(f"sqlite://{path}")
    try:
        assert store.counters() == {"ingest.telemetry": 7}, "the data is kept"
        token = store.acquire_lease("rollout-engine", "new", 10.0, now=100.0)
        assert token == 2, "the old lease row got term 1; the takeover is term 2"
    finally:
        store.close()
    assert _versions_sqlite(path) == list(range(1, latest_version("sqlite") + 1))


def test_opening_again_applies_nothing(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.sqlite"
    open_store(url).close()
    open_store(url).close()
    assert _versions_sqlite(tmp_path / "s.sqlite") == list(range(1, latest_version("sqlite") + 1))


def test_a_store_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.sqlite"
    open_store(url).close()
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (999, 'future', 0)")
    with pytest.raises(StoreError, match="schema version 999, newer than this edgefleet knows"):
        open_store(url)


def test_instances_opening_one_postgres_database_at_once_migrate_it_once(postgres: PostgresServer) -> None:
    import psycopg

    url = postgres.create_database("migrate")
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            open_store(url).close()
        except BaseException as err:  # collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    with psycopg.connect(url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, latest_version("postgresql") + 1))
