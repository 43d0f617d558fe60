"""What only the PostgreSQL store does: its URL options, a password kept out of messages, and waiting out a
database restart (a call made while the server is down succeeds once it is back; a lease renewal does not wait)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgefleet.control.store import Fence, FencedOut, RolloutRow, StoreError, open_store
from edgefleet.control.store.rollouts import SqlRollouts
from edgefleet.control.store.sql.postgres import url_options
from edgefleet.control.store.url import redacted
from edgefleet.core.messages import LatencySummary, Telemetry

from support.servers.pg_server import PostgresServer


def report(device: str, seq: int) -> Telemetry:
    return Telemetry(
        device_id=device, seq=seq, ts=1000.0 + seq, bundle_id="b1", provider="cpu", window_s=1.0, requests=1,
        errors=0, throughput_rps=1.0, latency=LatencySummary(count=1, p50_ms=1.0, p95_ms=1.0, p99_ms=1.0),
        golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=1.0,
    )  # fmt: skip


def test_url_options_are_ours_and_the_rest_goes_to_libpq() -> None:
    parsed = url_options("postgresql://u:pw@db:5433/fleet?sslmode=require&pool_size=3&retry_s=7&idle_tx_s=2.5")
    assert (parsed.pool_size, parsed.retry_s, parsed.idle_tx_s) == (3, 7.0, 2.5)
    assert parsed.conninfo == "postgresql://u:pw@db:5433/fleet?sslmode=require&connect_timeout=5"
    assert url_options("postgresql://db/fleet").idle_tx_s == 5.0
    with pytest.raises(StoreError, match="pool_size must be an integer"):
        url_options("postgresql://db/fleet?pool_size=many")
    with pytest.raises(StoreError, match="idle_tx_s must be at least 0"):
        url_options("postgresql://db/fleet?idle_tx_s=-1")
    assert redacted("postgresql://u:secret@db/fleet") == "postgresql://u:***@db/fleet"


def test_the_password_can_come_from_a_file_and_is_redacted_wherever_a_url_is_shown(tmp_path: Path) -> None:
    secret = tmp_path / "pg.pass"
    secret.write_text("s3cret pw\n")
    parsed = url_options(f"postgresql://u@db/fleet?password_file={secret}&pool_size=2")
    assert "password='s3cret pw'" in parsed.conninfo and "password_file" not in parsed.conninfo
    with pytest.raises(StoreError, match="cannot read its password file") as caught:
        url_options(f"postgresql://u@db/fleet?password_file={tmp_path / 'missing'}")
    assert "s3cret" not in str(caught.value)
    assert redacted("postgresql://u:p%40ss@db:5432/fleet?x=1") == "postgresql://u:***@db:5432/fleet?x=1"
    assert redacted("postgresql://u@db/fleet?password=pw&sslmode=require") == (
        "postgresql://u@db/fleet?password=***&sslmode=require"
    )


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


def test_a_leader_stalled_inside_a_fenced_write_does_not_hold_up_the_takeover(postgres: PostgresServer) -> None:
    """A fenced write holds the lease row FOR SHARE until it commits. A leader that stalls inside one (SIGSTOP, a
    paused VM) would block every takeover for as long as it stalls; the server ends its idle transaction instead,
    the takeover goes through while it is still stalled, and when it wakes its write is gone and its retry fenced."""
    url = postgres.create_database("stall") + "?idle_tx_s=1&retry_s=5"
    leader, other = open_store(url), open_store(url)
    try:
        term = leader.acquire_lease("engine", "a", ttl_s=0.5, now=time.time())
        assert term is not None
        fenced = leader.with_fence(Fence("engine", "a", term))
        rollouts = fenced.repos.rollouts
        assert isinstance(rollouts, SqlRollouts)
        inside, wake, woke = threading.Event(), threading.Event(), []

        def stalled_write() -> None:
            try:
                with rollouts.fenced_tx() as db:  # the lease row is held FOR SHARE from here to the commit
                    inside.set()
                    wake.wait(60)  # stalled: the session sits idle in its transaction
                    db.execute("SELECT 1")
                woke.append("committed")
            except Exception as err:  # what the woken leader saw is the result
                woke.append(type(err).__name__)

        writer = threading.Thread(target=stalled_write)
        writer.start()
        assert inside.wait(10)
        time.sleep(0.6)  # the lease is over; the leader is still stalled inside its write
        started = time.monotonic()
        taken = other.acquire_lease("engine", "b", ttl_s=30, now=time.time())
        waited = time.monotonic() - started
        assert taken is not None and taken > term, "the takeover got the lease while the old leader was stalled"
        assert not wake.is_set() and waited < 30, f"the takeover waited {waited:.1f} s"
        wake.set()
        writer.join(30)
        assert woke and woke[0] != "committed", "the stalled write was rolled back by the server"
        with pytest.raises(FencedOut, match=r"term .* of a is over"):
            fenced.save_rollout(RolloutRow(id="r1", state="running", doc="{}", created_at=0.0, updated_at=0.0))
    finally:
        wake.set()
        leader.close()
        other.close()
