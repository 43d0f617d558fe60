"""Model quality in the store, on both backends (SQLite and a real PostgreSQL): per-report golden scores, field
accuracy, drift and shadow figures are stored with their report, and a device crossing a drift band or failing its
golden check raises one alert (not one per repeat), in the order the device measured them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.store import Deployment, PublishedDesired, Store, open_store
from edgefleet.core.messages import DeviceStatus, DriftScore, LatencySummary, OutputScore, ShadowReport, Telemetry

from support.servers.pg_server import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path}/control.sqlite"
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        url = server.create_database("quality")
    s = open_store(url)
    yield s
    s.close()


def report(seq: int, ts: float, **fields: Any) -> Telemetry:
    base: dict[str, Any] = {
        "device_id": "q-1", "seq": seq, "ts": ts, "bundle_id": "b-1", "provider": "cpu", "window_s": 1.0,
        "requests": 10, "errors": 0, "throughput_rps": 10.0,
        "latency": LatencySummary(count=10, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0),
        "golden_agreement": 1.0, "golden_max_abs_error": 0.0, "cpu_percent": 1.0, "rss_mb": 50.0,
    }  # fmt: skip
    return Telemetry(**(base | fields))


def drift(band: str, psi: float) -> DriftScore:
    return DriftScore(name="pixels", kind="input", psi=psi, band=band, samples=256)  # type: ignore[arg-type]


def golden(passed: bool, score: float) -> OutputScore:
    return OutputScore(output="speech_prob", rule="continuous", score=score, passed=passed, detail={"sqnr_db": 31.0})


def test_quality_figures_are_stored_with_their_report_and_read_back(store: Store) -> None:
    shadow = ShadowReport(
        bundle_id="b-2", requests=40, agreement=0.8, latency=LatencySummary(count=40, p50_ms=1, p95_ms=2, p99_ms=3)
    )
    store.add_telemetry(
        [report(1, 100.0, golden_scores=[golden(True, 0.999)], drift=[drift("none", 0.01)], field_accuracy=0.93,
                field_samples=120, probe_requests=16, shadow=shadow),
         report(2, 101.0)],  # no quality figures: no quality row
        received_at=101.0,
    )  # fmt: skip
    points = store.quality("q-1", 0.0)
    assert len(points) == 1
    point = points[0]
    assert (point.field_accuracy, point.field_samples, point.probe_requests) == (0.93, 120, 16)
    assert point.golden[0].detail == {"sqnr_db": 31.0} and point.drift[0].psi == 0.01
    assert point.shadow is not None and point.shadow.agreement == 0.8 and point.shadow.bundle_id == "b-2"
    assert store.latest_quality() == {}, "only devices the registry knows"
    store.upsert_statuses([DeviceStatus(device_id="q-1", online=True, state="serving")], received_at=101.0)
    store.add_telemetry([report(3, 102.0, probe_requests=4)], received_at=102.0)
    assert store.latest_quality()[("q-1", "default")].ts == 102.0
    assert store.quality("q-1", 0.0, bundle_id="other") == []


def test_a_drift_band_crossing_raises_one_alert_per_change_and_repeats_raise_none(store: Store) -> None:
    bands = [("none", 0.02), ("none", 0.05), ("moderate", 0.15), ("drift", 0.4), ("drift", 0.5), ("none", 0.03)]
    reports = [report(i + 1, 100.0 + i, drift=[drift(b, p)]) for i, (b, p) in enumerate(bands)]
    for r in reports:
        store.add_telemetry([r], received_at=r.ts)
    store.add_telemetry(reports, received_at=200.0)  # at-least-once delivery: every report again
    alerts = store.alerts("q-1")
    assert [(a.level, a.subject) for a in alerts] == [
        ("warning", "drift:input:pixels"), ("critical", "drift:input:pixels"), ("info", "drift:input:pixels"),
    ]  # fmt: skip
    assert "rose to drift (PSI 0.400" in alerts[1].detail and "fell to none" in alerts[2].detail


def test_each_slot_has_its_own_drift_bands_and_golden_verdicts(store: Store) -> None:
    """Two models on one device may name an input alike; a crossing of one slot's never hides the other's."""
    store.add_telemetry([report(1, 100.0, drift=[drift("drift", 0.4)])], received_at=100.0)
    store.add_telemetry([report(2, 100.5, slot="detector", drift=[drift("none", 0.01)])], received_at=100.5)
    store.add_telemetry([report(3, 101.0, slot="detector", drift=[drift("drift", 0.5)])], received_at=101.0)
    store.add_telemetry([report(4, 102.0, slot="detector", golden_scores=[golden(False, 0.5)])], received_at=102.0)
    alerts = store.alerts("q-1")
    assert [(a.kind, a.level, a.subject) for a in alerts] == [
        ("drift", "critical", "drift:input:pixels"),
        ("drift", "critical", "slot=detector|drift:input:pixels"),
        ("golden", "critical", "slot=detector|golden:speech_prob"),
    ], "the detector's crossing is its own, though the default slot's input of that name was already in drift"
    assert alerts[1].detail.startswith("slot detector: input pixels drift rose to drift")
    assert [q.slot for q in store.quality("q-1", 0.0, slot="detector")] == ["detector"] * 3


def test_a_failing_golden_output_raises_a_critical_alert_and_a_late_report_changes_nothing(store: Store) -> None:
    store.add_telemetry([report(1, 100.0, golden_scores=[golden(True, 0.99)])], received_at=100.0)
    store.add_telemetry([report(3, 102.0, golden_scores=[golden(False, 0.71)])], received_at=102.0)
    store.add_telemetry([report(2, 101.0, golden_scores=[golden(True, 0.99)])], received_at=103.0)  # late
    alerts = store.alerts()
    assert [(a.kind, a.level) for a in alerts] == [("golden", "critical")], alerts
    assert "speech_prob fails: continuous score 0.7100" in alerts[0].detail


def test_an_older_store_gains_the_shadow_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE deployments (scope TEXT NOT NULL, target TEXT NOT NULL, profile TEXT NOT NULL,"
            " bundle_id TEXT NOT NULL, model_name TEXT NOT NULL, model_version TEXT NOT NULL, rollback INTEGER NOT"
            " NULL, source TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (scope, target, profile))"
        )
        db.execute("INSERT INTO deployments VALUES ('group', 'g', 'p', 'b-1', 'm', '1', 0, 'operator', 1.0)")
    store = open_store(str(path))
    try:
        assert store.deployments()[0].shadow_bundle_id is None
        store.put_deployment(Deployment("group", "g", "p", "b-1", "m", "1", shadow_bundle_id="b-2"))
        assert store.deployments()[0].shadow_bundle_id == "b-2"
        store.set_published(("d-1", "default"), PublishedDesired("d-1", "b-1", False, 1.0, "b-2"))
        assert store.published()[("d-1", "default")].shadow_bundle_id == "b-2"
    finally:
        store.close()


def test_the_quality_row_names_the_worst_output_the_worst_drift_and_the_shadow() -> None:
    from edgefleet.control.fleet.quality_view import of_telemetry, quality_cells

    t = report(
        1, 100.0, field_accuracy=0.9, field_samples=64,
        golden_scores=[
            golden(True, 0.99), OutputScore(output="logits", rule="class-agreement", score=0.5, passed=False),
        ],
        drift=[drift("moderate", 0.12), DriftScore(name="x", kind="output", psi=0.3, band="drift", samples=9)],
        shadow=ShadowReport(bundle_id="b-2", requests=7, agreement=0.75),
    )  # fmt: skip
    golden_cell, field_cell, drift_cell, shadow_cell = quality_cells(of_telemetry(t))
    assert golden_cell == "0.5000 logits FAIL(logits)"
    assert field_cell == "0.900 (n=64)" and drift_cell == "drift 0.300 output x" and shadow_cell == "b-2: 0.7500 over 7"
    assert quality_cells(of_telemetry(report(2, 101.0))) == ("", "", "", "")
