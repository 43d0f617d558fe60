"""The control plane's own health, seen from outside the process: a real control plane on a real Mosquitto and
a SQLite store, read by `edgefleet control status` (a separate process), the dashboard's /api/fleet and
/metrics. A loop that catches errors reads "failing" with its last error, a loop that stops completing reads
"stalled" after 3 intervals (at least 5 s), ingestion that cannot store shows its backlog, and an instance
that stops cleanly leaves no rows behind."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.health import COMPACTION, DESIRED_SYNC, ENGINE, INGEST, QUOTA, RETENTION, stall_limit
from edgefleet.control.rollout.engine import RolloutEngine
from edgefleet.control.store import Store, open_store
from edgefleet.control.store.sql.sqlite import SqliteDatabase

from support.rollouts.control_plane import control_plane, sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker

LAUNCH = "import sys; from edgefleet.cli import main\nsys.exit(main.main(sys.argv[1:]))"


def control_status(store_url: str) -> tuple[int, dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-c", LAUNCH, "control", "status", "--store", store_url, "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def get(url: str, token: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


def loop_of(status: dict[str, object], component: str) -> dict[str, object]:
    return next(r for r in status["loops"] if r["component"] == component)  # type: ignore[attr-defined,index]


def test_a_failing_sync_reads_failing_everywhere_while_the_engine_goes_on(
    mosquitto: MosquittoBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_sync(self: DesiredPublisher) -> None:
        raise RuntimeError("the broker refused the documents")

    monkeypatch.setattr(DesiredPublisher, "sync", broken_sync)
    store_url = f"sqlite://{tmp_path}/control.sqlite"
    with control_plane(mosquitto.url, tmp_path, http_port=0) as plane:
        token = auth.issue_token(plane.store, "ops")
        wait_until("the sync's failure in the store", lambda: any(
            r.component == DESIRED_SYNC and r.errors_per_min for r in plane.store.repos.health.health()))  # fmt: skip
        code, status = control_status(store_url)
        sync, engine = loop_of(status, DESIRED_SYNC), loop_of(status, ENGINE)
        assert code == 1 and status["healthy"] is False
        assert sync["state"] == "failing" and "the broker refused the documents" in str(sync["last_error"])
        assert engine["state"] == "ok", "a failing sync does not stop the rollouts from stepping"
        assert status["engine"]["state"] == "failing"  # type: ignore[index]
        fleet = json.loads(get(plane.dashboard_url + "api/fleet", token))  # type: ignore[operator]
        assert fleet["engine"]["state"] == "failing" and "desired-sync" in fleet["engine"]["detail"]
        metrics = get(plane.dashboard_url + "metrics", token).decode()  # type: ignore[operator]
        assert f'edgefleet_control_loop_errors_per_minute{{instance="{plane.holder}",loop="desired-sync"}}' in metrics
        assert f'edgefleet_control_loop_stalled{{instance="{plane.holder}",loop="rollout-engine"}} 0' in metrics
    code, status = control_status(store_url)
    assert status["loops"] == [], "a clean stop leaves no rows to read as stalled"


@pytest.mark.slow
def test_an_engine_that_stops_ticking_reads_stalled_in_the_status_the_dashboard_and_metrics(
    mosquitto: MosquittoBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_tick = RolloutEngine.tick

    def hung_tick(self: RolloutEngine) -> list[object]:
        release.wait(120)  # a store call that never returns
        return real_tick(self)  # type: ignore[return-value]

    store_url = f"sqlite://{tmp_path}/control.sqlite"
    with control_plane(mosquitto.url, tmp_path, http_port=0) as plane:
        token = auth.issue_token(plane.store, "ops")
        wait_until("a first tick", lambda: loop_of(control_status(store_url)[1], ENGINE)["last_tick"], timeout=30)
        monkeypatch.setattr(RolloutEngine, "tick", hung_tick)
        try:
            limit = stall_limit(plane.config.tick_s)
            status = wait_until(
                "the engine read as stalled",
                lambda: (s := control_status(store_url)[1]) and loop_of(s, ENGINE)["state"] == "stalled" and s,
                timeout=limit + 30, every=1.0,
            )  # fmt: skip
            assert status["engine"]["state"] == "stalled" and "not completed" in status["engine"]["detail"]  # type: ignore[index]
            fleet = json.loads(get(plane.dashboard_url + "api/fleet", token))  # type: ignore[operator]
            assert fleet["engine"]["state"] == "stalled"
            metrics = get(plane.dashboard_url + "metrics", token).decode()  # type: ignore[operator]
            assert "edgefleet_control_engine_running 0" in metrics
            assert f'edgefleet_control_loop_stalled{{instance="{plane.holder}",loop="rollout-engine"}} 1' in metrics
        finally:
            release.set()
            monkeypatch.setattr(RolloutEngine, "tick", real_tick)
        wait_until("the engine running again", lambda: control_status(store_url)[1]["engine"]["state"] == "running",  # type: ignore[index]
                   timeout=30, every=0.5)  # fmt: skip
    store = open_store(store_url)
    try:
        assert store.repos.health.health() == []
    finally:
        store.close()


def test_ingestion_that_cannot_store_shows_its_backlog_and_reads_failing(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    """A real fault: another connection holds the SQLite write lock for 4 s while 3 simulated devices report 10
    times a second. Meanwhile /metrics shows the backlog growing; after it, `control status` reads ingest as
    failing (the store failed its batches) and the backlog is gone."""
    path = tmp_path / "control.sqlite"
    store = Store(SqliteDatabase(path, f"sqlite://{path}", busy_timeout_s=0.5))
    with (
        control_plane(mosquitto.url, tmp_path, store=store, engine=False, http_port=0) as plane,
        sim_fleet(mosquitto.url, ["lag-1", "lag-2", "lag-3"], telemetry_interval=0.1),
    ):
        token = auth.issue_token(store, "ops")
        wait_until("telemetry flowing", lambda: store.telemetry_count() >= 20)
        blocker = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            time.sleep(4.0)  # the fault's length is the point
            during = plane.local_metrics()
            metrics = get(plane.dashboard_url + "metrics", token).decode()  # type: ignore[operator]
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert during["ingest_backlog_messages"] > 0 and during["ingest_backlog_oldest_seconds"] >= 2.0, during
        assert "edgefleet_ingest_backlog_oldest_seconds " in metrics
        status = wait_until("ingest failing in the store", lambda: (s := control_status(f"sqlite://{path}")[1])
                            and loop_of(s, INGEST)["state"] == "failing" and s)  # fmt: skip
        assert "the store failed a batch" in str(loop_of(status, INGEST)["last_error"])
        wait_until("the backlog stored", lambda: plane.local_metrics()["ingest_backlog_messages"] < 10)


def test_compaction_retention_and_the_quota_are_loops_of_their_own_and_one_failing_skips_none(
    mosquitto: MosquittoBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: compaction failed for every device and the quota, run in the same step, never ran. Now a failing
    compaction reads failing in `control status` with its error, while retention and the quota complete."""

    def broken_downsample(self: Store, *args: object, **kwargs: object) -> tuple[int, int]:
        raise RuntimeError("integer overflow")

    monkeypatch.setattr(Store, "downsample", broken_downsample)
    store_url = f"sqlite://{tmp_path}/control.sqlite"
    with control_plane(mosquitto.url, tmp_path, compact_every_s=0.2, quota_every_s=0.2) as plane:
        wait_until("retention and the quota to complete and compaction to fail", lambda: {
            (r.component, bool(r.errors_per_min), r.last_tick is not None) for r in plane.store.repos.health.health()
        } >= {(COMPACTION, True, False), (RETENTION, False, True), (QUOTA, False, True)})  # fmt: skip
        code, status = control_status(store_url)
    compaction, retention, quota = (loop_of(status, name) for name in (COMPACTION, RETENTION, QUOTA))
    assert code == 1 and status["healthy"] is False
    # it never completes, so it reads stalled once three of its periods passed, failing before: unwell either way
    assert compaction["state"] in ("failing", "stalled") and "integer overflow" in str(compaction["last_error"])
    assert retention["state"] == quota["state"] == "ok" and retention["last_tick"] and quota["last_tick"]
