"""`edgefleet fleet status` on a device that runs several models (issue 33): one row per (device, slot), each with
its own bundle, provider, latency, drift, memory and refusal, from the device's retained status and each slot's
telemetry on a real Mosquitto."""

from __future__ import annotations

import time

from edgefleet.control.fleet.status import FleetView
from edgefleet.core.messages import DeviceStatus, DriftScore, LatencySummary, SlotStatus, Telemetry
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.rollouts.control_plane import wait_until
from support.servers.brokers import MosquittoBroker


def test_fleet_status_has_a_row_per_slot_with_that_slots_figures(mosquitto: MosquittoBroker, host: Connection) -> None:
    topics, device = Topics(), f"fs-slots-{time.monotonic_ns() % 10**6}"
    slots = [
        SlotStatus(slot="detector", state="serving", active_bundle="det-1", provider_in_use="CPUExecutionProvider",
                   verified=True, memory_mb=120.0, latency_objective_ms=30.0),
        SlotStatus(slot="assistant", state="idle", refused="assistant needs 610 MB, 420 MB free after detector "
                   "(budget 2048 MB)"),
    ]  # fmt: skip
    status = DeviceStatus(device_id=device, online=True, state="serving", profile="generic-x86-64", slots=slots)
    conn = Connection(mosquitto.url, f"{device}-view").start()
    try:
        _check(FleetView(conn, topics), host, topics, device, status)
    finally:
        conn.stop()


def _check(view: FleetView, host: Connection, topics: Topics, device: str, status: DeviceStatus) -> None:
    host.publish(topics.status(device), status.encode(), retain=True, wait=10)
    report = Telemetry(
        device_id=device, seq=1, slot="detector", bundle_id="det-1", provider="CPUExecutionProvider", window_s=1.0,
        requests=20, errors=0, throughput_rps=20.0, latency=LatencySummary(count=20, p50_ms=12.0, p95_ms=21.0,
        p99_ms=25.0), golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=5.0, rss_mb=300.0,
        drift=[DriftScore(name="image", kind="input", psi=0.3, band="drift", samples=500)],
    )  # fmt: skip
    wait_until("the status", lambda: device in view.statuses())
    host.publish(topics.telemetry(device), report.encode(), wait=10)
    wait_until("the detector's report", lambda: (device, "detector") in view.telemetry())
    rows = {r.slot: r for r in view.rows() if r.device_id == device}
    assert set(rows) == {"detector", "assistant"}
    detector, assistant = rows["detector"], rows["assistant"]
    assert (detector.bundle, detector.provider, detector.p95_ms, detector.memory_mb) == (
        "det-1", "CPUExecutionProvider", 21.0, 120.0,
    )  # fmt: skip
    assert detector.quality.drift_band == "drift" and detector.verified and detector.latency_objective_ms == 30.0
    assert assistant.bundle is None and assistant.p95_ms is None and not assistant.verified
    assert assistant.refused is not None and assistant.refused.startswith("assistant needs 610 MB")
