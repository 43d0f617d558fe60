"""Opening a store from its URL: the database by scheme, its repositories composed into a `Store`.

- `sqlite:///var/lib/edgefleet/control.sqlite` (or a plain path): one file, the embedded default for one
  machine. Several processes on that machine may share it.
- `postgresql://user@host:5432/edgefleet`: several control-plane instances on several machines; needs the
  `host` extra (psycopg 3 and psycopg-pool).
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.control.store.errors import StoreError
from edgefleet.control.store.sql.database import Database
from edgefleet.control.store.store import Store
from edgefleet.control.store.url import redacted


def _sqlite(url: str) -> Database:
    from edgefleet.control.store.sql.sqlite import SqliteDatabase

    path = url.split("://", 1)[1] if "://" in url else url.removeprefix("sqlite:")
    if not path or path in ("/", ":memory:", "/:memory:"):
        raise StoreError(f"store URL {redacted(url)!r} names no file; use sqlite:///absolute/path.sqlite")
    return SqliteDatabase(Path(path), url)


def _postgres(url: str) -> Database:
    try:
        from edgefleet.control.store.sql.postgres import PostgresDatabase
    except ImportError as err:
        raise StoreError(
            f"a PostgreSQL store needs psycopg 3 and psycopg-pool ({err}): pip install 'edgefleet[host]'"
        ) from err
    return PostgresDatabase(url)


_DATABASES = {"sqlite": _sqlite, "postgresql": _postgres, "postgres": _postgres}


def open_database(url: str) -> Database:
    """The database behind a store URL (see `open_store`), migrated to this edgefleet's schema."""
    if "://" not in url and not url.startswith("sqlite:"):
        return _sqlite(f"sqlite://{Path(url).resolve()}")
    scheme = url.split(":", 1)[0].lower()
    opener = _DATABASES.get(scheme)
    if opener is None:
        raise StoreError(
            f"unknown store URL scheme {scheme!r} in {redacted(url)!r}; valid: {', '.join(sorted(_DATABASES))}"
        )
    return opener(url)


def open_store(url: str) -> Store:
    """A store from its URL: `sqlite:///abs/path.sqlite`, `sqlite:relative.sqlite`, a plain file path, or
    `postgresql://user:password@host:port/database` (a libpq URL; `?sslmode=...` and friends included)."""
    return Store(open_database(url))
