"""Opening a store from its URL: the backends by scheme. Kept apart from `store` (the interface), which the
backends import, so that no backend and the interface import each other.

- `sqlite:///var/lib/edgefleet/control.sqlite` (or a plain path): one file, the embedded default for one
  machine. Several processes on that machine may share it.
- `postgresql://user@host:5432/edgefleet`: several control-plane instances on several machines; needs the
  `host` extra (psycopg 3 and psycopg-pool).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgefleet.control.store import Store, StoreError

Opener = Callable[[str], Store]
_BACKENDS: dict[str, Opener] = {}


def register_backend(scheme: str, opener: Opener) -> None:
    _BACKENDS[scheme] = opener


def _open_sqlite(url: str) -> Store:
    from edgefleet.control.store_sqlite import SqliteStore

    path = url.split("://", 1)[1] if "://" in url else url.removeprefix("sqlite:")
    if not path or path in ("/", ":memory:", "/:memory:"):
        raise StoreError(f"store URL {url!r} names no file; use sqlite:///absolute/path.sqlite")
    return SqliteStore(Path(path), url)


def _open_postgres(url: str) -> Store:
    try:
        from edgefleet.control.store_postgres import PostgresStore
    except ImportError as err:
        raise StoreError(
            f"a PostgreSQL store needs psycopg 3 and psycopg-pool ({err}): pip install 'edgefleet[host]'"
        ) from err
    return PostgresStore(url)


register_backend("sqlite", _open_sqlite)
register_backend("postgresql", _open_postgres)
register_backend("postgres", _open_postgres)


def open_store(url: str) -> Store:
    """A store from its URL: `sqlite:///abs/path.sqlite`, `sqlite:relative.sqlite`, a plain file path, or
    `postgresql://user:password@host:port/database` (a libpq URL; `?sslmode=...` and friends included)."""
    if "://" not in url and not url.startswith("sqlite:"):
        return _open_sqlite(f"sqlite://{Path(url).resolve()}")
    scheme = url.split(":", 1)[0].lower()
    opener = _BACKENDS.get(scheme)
    if opener is None:
        raise StoreError(f"unknown store URL scheme {scheme!r} in {url!r}; valid: {', '.join(sorted(_BACKENDS))}")
    return opener(url)
