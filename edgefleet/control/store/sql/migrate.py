"""Versioned schema migrations: plain SQL files per dialect, applied in order, recorded in `schema_version`.

`migrations/<dialect>/NNNN_description.sql` holds the statements that take the schema from version NNNN-1 to
NNNN (one file per change, never edited once released). On open, a store applies the files it has not yet
applied, each in its own transaction together with its `schema_version` row, under a lock that makes
concurrent openers (several control-plane instances starting at once) take turns: the first migrates, the
others find nothing to do. A store newer than this code (a version we have no file for) is refused.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgefleet.control.store.errors import StoreError
from edgefleet.control.store.sql.database import Db

MIGRATIONS = Path(__file__).with_name("migrations")
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
    " applied_at DOUBLE PRECISION NOT NULL)"
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def split_statements(sql: str) -> list[str]:
    """The statements of a migration file (`;` at the end of a line ends one; `--` comments are dropped)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE) if s.strip()]


def migrations(dialect: str) -> list[Migration]:
    """The dialect's migrations in version order; a StoreError if the files are misnumbered."""
    found = []
    for path in sorted((MIGRATIONS / dialect).glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise StoreError(f"migration file {path} is not named NNNN_description.sql")
        found.append(Migration(int(match[1]), match[2], tuple(split_statements(path.read_text()))))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StoreError(f"the {dialect} migrations are numbered {versions}; they must run 1, 2, 3, ... with no gap")
    return found


def latest_version(dialect: str) -> int:
    return len(migrations(dialect))


def migrate(dialect: str, locked_tx: Callable[[], contextlib.AbstractContextManager[Db]], url: str) -> list[Migration]:
    """Apply what is missing; the migrations applied now. `locked_tx` opens a write transaction that holds the
    store's migration lock (BEGIN IMMEDIATE for SQLite, an advisory transaction lock for PostgreSQL)."""
    wanted = migrations(dialect)
    applied: list[Migration] = []
    while True:
        with locked_tx() as db:
            db.execute(VERSION_TABLE)
            (current,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
            current = int(current)
            if current > len(wanted):
                raise StoreError(
                    f"the store {url} is at schema version {current}, newer than this edgefleet knows "
                    f"({len(wanted)}): upgrade edgefleet"
                )
            if current == len(wanted):
                return applied
            step = wanted[current]
            for statement in step.statements:
                if dialect == "sqlite" and _ADD_COLUMN.match(statement) and _has_column(db, statement):
                    continue  # SQLite has no ADD COLUMN IF NOT EXISTS; a file made before migrations may have it
                db.execute(statement)
            db.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                (step.version, step.name, time.time()),
            )
        applied.append(step)


_ADD_COLUMN = re.compile(r"^ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)


def _has_column(db: Db, statement: str) -> bool:
    match = _ADD_COLUMN.match(statement)
    assert match is not None
    return any(row[1] == match[2] for row in db.execute(f"PRAGMA table_info({match[1]})").fetchall())


def schema_version(db: Db) -> int:
    (version,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
    return int(version)
