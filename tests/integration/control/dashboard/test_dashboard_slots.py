"""The dashboard's views of a device that runs several models (issue 33): `/api/fleet` lists each slot with its
bundle, provider, latency, golden, drift and memory, and `/metrics` has a series per (device, slot)."""

from __future__ import annotations

import time
from pathlib import Path

from edgefleet.control.dashboard.metrics import metrics_page
from edgefleet.control.dashboard.views import api_fleet
from edgefleet.control.store import open_store
from edgefleet.core.messages import DeviceStatus, DriftScore, LatencySummary, SlotStatus, Telemetry


def test_the_fleet_api_and_metrics_show_each_slot_of_a_device(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    now = time.time()
    slots = [
        SlotStatus(slot="detector", state="serving", active_bundle="det-1", provider_in_use="CPUExecutionProvider",
                   verified=True, slot_class="real-time", latency_objective_ms=30.0, memory_mb=120.0),
        SlotStatus(slot="assistant", state="idle", refused="assistant needs 610 MB, 420 MB free after detector "
                   "(budget 2048 MB)"),
    ]  # fmt: skip
    store.upsert_statuses([DeviceStatus(device_id="cam-1", online=True, state="serving", slots=slots)], now)
    report = Telemetry(
        device_id="cam-1", seq=1, ts=now, slot="detector", bundle_id="det-1", provider="CPUExecutionProvider",
        window_s=1.0, requests=20, errors=0, throughput_rps=20.0,
        latency=LatencySummary(count=20, p50_ms=12.0, p95_ms=21.0, p99_ms=25.0), golden_agreement=1.0,
        golden_max_abs_error=0.0, cpu_percent=5.0, rss_mb=300.0,
        drift=[DriftScore(name="image", kind="input", psi=0.3, band="drift", samples=500)],
    )  # fmt: skip
    store.add_telemetry([report], now)
    try:
        (device,) = api_fleet(store, now)["devices"]
        by_slot = {s["slot"]: s for s in device["slots"]}
        detector, assistant = by_slot["detector"], by_slot["assistant"]
        assert (detector["bundle"], detector["provider"], detector["p95_ms"]) == ("det-1", "CPUExecutionProvider", 21.0)
        assert (detector["golden_agreement"], detector["drift_band"], detector["memory_mb"]) == (1.0, "drift", 120.0)
        assert detector["latency_objective_ms"] == 30.0 and assistant["bundle"] is None
        assert assistant["refused"].startswith("assistant needs 610 MB")
        page = metrics_page(store, {}, 0)[0].decode()
        for line in (
            'edgefleet_device_slot_info{device="cam-1",slot="detector",bundle="det-1",provider="CPUExecutionProvider",'
            'state="serving"} 1',
            'edgefleet_device_slot_info{device="cam-1",slot="assistant",bundle="",provider="",state="idle"} 1',
            'edgefleet_device_slot_latency_p95_seconds{device="cam-1",slot="detector"} 0.021',
            'edgefleet_device_slot_latency_objective_seconds{device="cam-1",slot="detector"} 0.03',
            'edgefleet_device_slot_drift_psi{device="cam-1",slot="detector"} 0.3',
            f'edgefleet_device_slot_memory_bytes{{device="cam-1",slot="detector"}} {120 * 1024 * 1024:.6g}',
            'edgefleet_device_slot_verified{device="cam-1",slot="assistant"} 0',
        ):
            assert line in page, line
        assert 'edgefleet_device_slot_latency_p95_seconds{device="cam-1",slot="assistant"}' not in page, "no report"
    finally:
        store.close()


def test_the_fleet_api_shows_each_devices_agent_version(tmp_path: Path) -> None:
    """The dashboard's fleet table has an agent column (issue 35): the version each device's status reports."""
    store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    now = time.time()
    statuses = [
        DeviceStatus(device_id="cam-1", online=True, state="serving", agent_version="0.2.0"),
        DeviceStatus(device_id="cam-2", online=True, state="serving", agent_version="0.1.0"),
    ]
    store.upsert_statuses(statuses, now)
    try:
        versions = {d["device_id"]: d["agent_version"] for d in api_fleet(store, now)["devices"]}
        assert versions == {"cam-1": "0.2.0", "cam-2": "0.1.0"}
        page = (Path(__file__).parents[4] / "edgefleet" / "control" / "dashboard" / "web" / "index.html").read_text()
        assert "<th>agent</th>" in page
    finally:
        store.close()
