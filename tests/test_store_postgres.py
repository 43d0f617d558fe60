"""What only the PostgreSQL store does: its URL options, a password kept out of messages, and waiting out a
database restart (a call made while the server is down succeeds once it is back; a lease renewal does not wait)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgefleet.control.store import StoreError
from edgefleet.control.store_open import open_store
from edgefleet.control.store_postgres import _options, _redacted
from edgefleet.core.messages import LatencySummary, Telemetry

from pg_server import PostgresServer


def report(device: str, seq: int) -> Telemetry:
    return Telemetry(
        device_id=device, seq=seq, ts=1000.0 + seq, bundle_id="b1", provider="cpu", window_s=1.0, requests=1,
        errors=0, throughput_rps=1.0, latency=LatencySummary(count=1, p50_ms=1.0, p95_ms=1.0, p99_ms=1.0),
        golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=1.0,
    )  # fmt: skip


def test_url_options_are_ours_and_the_rest_goes_to_libpq() -> None:
    conninfo, size, retry_s = _options("postgresql://u:pw@db:5433/fleet?sslmode=require&pool_size=3&retry_s=7")
    assert (size, retry_s) == (3, 7.0)
    assert conninfo == "postgresql://u:pw@db:5433/fleet?sslmode=require&connect_timeout=5"
    with pytest.raises(StoreError, match="pool_size must be an integer"):
        _options("postgresql://db/fleet?pool_size=many")
    assert _redacted("postgresql://u:secret@db/fleet") == "postgresql://u:***@db/fleet"


def test_a_wrong_password_never_appears_in_the_error(postgres: PostgresServer) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(f"postgresql://nobody:hunter2@127.0.0.1:{postgres.port}/nowhere")
    assert "hunter2" not in str(caught.value) and "nobody:***@" in str(caught.value)


def test_calls_wait_out_a_database_restart(tmp_path: Path) -> None:
    with PostgresServer() as pg:
        store = open_store(pg.create_database("restart") + "?retry_s=60")
        try:
            assert store.add_telemetry([report("d1", 1)], 1.0) == 1
            pg.stop()
            with pytest.raises(StoreError, match="failed"):
                store.acquire_lease("engine", "a", 10.0, time.time())  # a renewal is not retried: it says so at once
            restarted = threading.Timer(2.0, pg.start)
            restarted.start()
            began = time.monotonic()
            assert store.add_telemetry([report("d1", 2)], 2.0) == 1, "waited for the server, then wrote"
            restarted.join()
            assert time.monotonic() - began >= 1.5 and store.telemetry_count("d1") == 2
            assert store.acquire_lease("engine", "a", 10.0, time.time()) is not None
        finally:
            store.close()
