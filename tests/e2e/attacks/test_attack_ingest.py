"""Issue 20's ingest attacks, with one device certificate on the shipped secure Mosquitto configuration and a real
control plane; each counted in the attack ledger:

- an event and telemetry flood with oversized strings (it must not fill the store, nor starve another device);
- a newline in a device string (it must not forge a line in the control plane's log, nor reach the store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgefleet.control.server import ControlPlane
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, OutputScore, Telemetry
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.attacks.ledger import AttackLedger
from support.rollouts.control_plane import control_plane, wait_until
from support.servers.secure_broker import SecureBroker, make_pki

pytestmark = pytest.mark.slow

TOPICS = Topics()
FLOODER, CALM = "in-flood-1", "in-calm-1"


@dataclass
class Plant:
    broker: SecureBroker
    plane: ControlPlane
    store_file: Path


@pytest.fixture
def plant(tmp_path: Path) -> Iterator[Plant]:
    pki = make_pki(tmp_path / "pki", [FLOODER, CALM])
    with (
        SecureBroker(pki, {FLOODER: [], CALM: []}) as broker,
        control_plane(broker.url, tmp_path, tls=pki.tls(HOST_IDENTITY), engine=False) as plane,
    ):
        yield Plant(broker, plane, tmp_path / "control.sqlite")


def _report(device: str, seq: int, **changes: object) -> Telemetry:
    fields: dict[str, object] = {
        "device_id": device, "seq": seq, "bundle_id": None, "provider": "cpu", "window_s": 1.0, "requests": 0,
        "errors": 0, "throughput_rps": 0.0, "latency": LatencySummary(count=0, p50_ms=None, p95_ms=None, p99_ms=None),
        "golden_agreement": None, "golden_max_abs_error": None, "cpu_percent": 1.0, "rss_mb": 1.0,
    }  # fmt: skip
    fields.update(changes)
    return Telemetry(**fields)  # type: ignore[arg-type]


def _device(plant: Plant, device: str) -> Connection:
    conn = plant.broker.connect(device, client_id=device)
    status = DeviceStatus(device_id=device, online=True, state="idle")
    conn.publish(TOPICS.status(device), status.encode(), retain=True, wait=10)
    wait_until(f"{device} in the store", lambda: plant.plane.store.device(device), 30)
    return conn


def _store_bytes(plant: Plant) -> int:
    return sum(p.stat().st_size for p in plant.store_file.parent.glob(plant.store_file.name + "*"))


def test_an_event_and_telemetry_flood_with_oversized_strings_neither_fills_the_store_nor_starves_others(
    plant: Plant, attack_ledger: AttackLedger
) -> None:
    flooder, calm = _device(plant, FLOODER), _device(plant, CALM)
    store = plant.plane.store
    try:
        before, started = _store_bytes(plant), time.monotonic()
        big = "x" * 200_000  # under the broker's 256 KiB packet limit, over the control plane's 64 KiB
        for seq in range(1, 201):
            event = Event(device_id=FLOODER, kind="error", seq=seq, detail=big)
            flooder.publish(TOPICS.events(FLOODER), event.encode(), qos=0)
        long_text = "y" * 3_000  # under the size cap: the text is cut, the report kept
        for seq in range(201, 5201):
            report = _report(FLOODER, seq, provider=long_text)
            flooder.publish(TOPICS.telemetry(FLOODER), report.encode(), qos=1)
        # meanwhile the calm device reports as usual
        for seq in range(1, 11):
            calm.publish(TOPICS.telemetry(CALM), _report(CALM, seq).encode(), wait=10)
        wait_until("the calm device's reports", lambda: store.telemetry_count(CALM) == 10, 60)
        counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
        seen = [-1]

        def settled() -> bool:  # what the broker passed on (QoS 0: it may drop some) is all handled
            now, seen[0] = counts["received"], counts["received"]
            time.sleep(2.0)
            return now == counts["received"] and now > 1000

        wait_until("the flood handled", settled, 180)
        limits = plant.plane.ingestor.admission.limits  # type: ignore[union-attr]
        allowed = limits.burst_messages + limits.messages_per_s * (time.monotonic() - started)
        grown_mb = (_store_bytes(plant) - before) / 1e6
        stored = store.telemetry_count(FLOODER)
        alerts = [a for a in store.alerts(device_id=FLOODER) if a.kind == "device-over-budget"]
        longest = max((len(p.provider or "") for p in store.telemetry(FLOODER, 0.0)), default=0)
    finally:
        flooder.stop()
        calm.stop()
    filled = grown_mb > 10.0 or longest > 2000 or stored > allowed
    assert not attack_ledger.record(
        "an event and telemetry flood with oversized strings (200 x 200 KB events, 5,000 reports)",
        filled or not alerts,
        f"store grew {grown_mb:.1f} MB; {counts['received']} messages reached the control plane, {stored} of "
        f"5,000 reports stored (its budget allowed {allowed:.0f}), the longest string {longest} chars; "
        f"oversized {counts['oversized']}, over budget {counts['over_budget']}; alerts: {len(alerts)}; "
        "the calm device: all 10 stored",
    )


def test_a_newline_in_a_device_string_forges_no_log_line_and_is_refused(
    plant: Plant, attack_ledger: AttackLedger, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "ok\n2026-12-03 12:00:00 INFO edgefleet.control: FORGED operator logged in"
    conn = _device(plant, FLOODER)
    store = plant.plane.store
    caplog.set_level(logging.INFO)
    try:
        scores = [OutputScore(output=forged, rule="class-agreement", score=1.0, passed=True)]
        conn.publish(TOPICS.telemetry(FLOODER), _report(FLOODER, 1, golden_scores=scores).encode(), wait=10)
        conn.publish(TOPICS.telemetry(FLOODER), _report(FLOODER, 2, bundle_id=forged).encode(), wait=10)
        conn.publish(TOPICS.events(FLOODER), Event(device_id=FLOODER, kind="error", seq=3, detail=forged).encode(),
                     wait=10)  # fmt: skip
        conn.publish(TOPICS.telemetry(FLOODER), b'{"device_id": "' + forged.encode() + b'"', wait=10)
        counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
        wait_until("the four messages handled", lambda: counts["received"] >= 5, 30)  # with the status
        time.sleep(1.0)
    finally:
        conn.stop()
    lines = [line for record in caplog.records for line in record.getMessage().split("\n")]
    forged_lines = [line for line in lines if line.startswith("2026-12-03 12:00:00 INFO")]
    stored_names = [s.output for q in store.quality(FLOODER, 0.0) for s in q.golden]
    event_details = [e.detail for e in store.events(device_id=FLOODER)]
    assert not attack_ledger.record(
        "a newline in a device string (an output name, a bundle id, an event detail, a malformed payload)",
        bool(forged_lines) or any("\n" in n for n in stored_names) or store.telemetry_count(FLOODER) > 0,
        f"log lines forged: {len(forged_lines)}; invalid refused: {counts['invalid']}; malformed: "
        f"{counts['malformed']}; reports stored: {store.telemetry_count(FLOODER)}; event details stored: "
        f"{len(event_details)} (shown through safe_text)",
    )
