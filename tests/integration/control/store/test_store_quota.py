"""Retention by bytes (edgefleet/control/store/quota.py), on both backends: a device that holds more than its
quota in the store loses its oldest rows in every table by the same fraction, down to 90 % of the quota, and no
other device loses anything; the control plane counts it and raises a `device-over-quota` alert."""

from __future__ import annotations

from pathlib import Path

from edgefleet.control.server import ControlConfig, ControlPlane
from edgefleet.control.store import Store
from edgefleet.control.store.quota import KEEP, device_bytes
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, Telemetry


def fill(store: Store, device: str, events: int, reports: int, detail: int) -> None:
    store.upsert_statuses([DeviceStatus(device_id=device, online=True, state="serving")], 1000.0)
    store.add_events([Event(device_id=device, kind="error", seq=i + 1, ts=1000.0 + i, detail="x" * detail)
                      for i in range(events)], 2000.0)  # fmt: skip
    store.add_telemetry([
        Telemetry(device_id=device, seq=events + i + 1, ts=1000.0 + i, bundle_id="b1", provider="cpu", window_s=1.0,
                  requests=10, errors=0, throughput_rps=10.0, golden_agreement=1.0, golden_max_abs_error=0.0,
                  latency=LatencySummary(count=10, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0), cpu_percent=5.0, rss_mb=50.0)
        for i in range(reports)
    ], 2000.0)  # fmt: skip


def held(store: Store, device: str) -> int:
    return sum(size for _, size in device_bytes(store.db).get(device, {}).values())


def test_a_device_over_its_quota_keeps_its_newest_rows_and_the_others_keep_everything(store: Store) -> None:
    fill(store, "flooder", events=2000, reports=2000, detail=2000)  # about 4.5 MB
    fill(store, "quiet", events=50, reports=500, detail=40)
    quiet_before = held(store, "quiet")
    quota = 1_000_000
    (cut,) = store.enforce_device_quota(quota)
    assert cut.device_id == "flooder" and cut.held_bytes > 4 * quota
    assert KEEP * quota * 0.95 <= held(store, "flooder") <= KEEP * quota * 1.01
    assert held(store, "quiet") == quiet_before
    kept = store.events("flooder", limit=10_000)
    assert kept and kept[-1].seq == 2000, "the newest are kept"
    assert min(e.seq for e in kept) > 1500
    reports = store.telemetry("flooder", 0.0)
    assert reports and reports[-1].ts == 1000.0 + 1999 and len(reports) < 2000 * 0.25
    assert cut.deleted["events"] == 2000 - len(kept) and cut.deleted["telemetry"] == 2000 - len(reports)
    assert store.enforce_device_quota(quota) == [], "within its quota after the cut"


def test_the_control_plane_counts_the_cut_and_raises_an_alert(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/plane.sqlite"
    plane = ControlPlane(ControlConfig(broker="mqtt://127.0.0.1:1", store_url=url, http_port=None,
                                       device_store_bytes=500_000))  # fmt: skip
    try:
        fill(plane.store, "flooder", events=1000, reports=10, detail=2000)
        (cut,) = plane.enforce_quota()
        assert plane.store.counters()["ingest.quota_deleted"] == sum(cut.deleted.values()) > 0
        (alert,) = plane.store.alerts("flooder")
        assert alert.kind == "device-over-quota" and "oldest rows deleted" in alert.detail
    finally:
        plane.store.close()
