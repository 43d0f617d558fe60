"""The store on both backends (SQLite and a real PostgreSQL), for the store tests in this folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.store import Store, open_store

from support.servers.pg_server import PostgresServer

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store's URL: a SQLite file, or a new database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/control.sqlite"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database("store")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()
