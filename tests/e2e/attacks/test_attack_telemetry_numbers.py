"""Issue 32's attacks on telemetry numbers (4, 5 and the "partly" row), with one device certificate on the shipped
secure Mosquitto configuration and a real control plane and dashboard; each counted in the attack ledger. The
payloads are written as an attacker would, with Python's json (which writes Infinity and NaN), not through the
typed models that would refuse them on the sending side.

- `p95_ms: Infinity` and a report dated ts=1e15: the dashboard's every JSON answer must stay strict JSON,
  `devices list --json` too, and no report of the future may become a device's latest;
- `requests = 2**62` in old-dated reports: never stored, and compaction, retention and the quota all complete;
- negative counters and -inf CPU: never stored, never shown.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.health import COMPACTION, QUOTA, RETENTION
from edgefleet.control.server import ControlPlane
from edgefleet.core.messages import DeviceStatus, Hardware
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.attacks.ledger import AttackLedger
from support.paths import REPO
from support.rollouts.control_plane import control_plane, wait_until
from support.servers.secure_broker import SecureBroker, make_pki

pytestmark = pytest.mark.slow

TOPICS = Topics()
ATTACKER, NEIGHBOUR = "num-attacker-1", "num-calm-1"
LAUNCH = "import sys; from edgefleet.cli import main\nsys.exit(main.main(sys.argv[1:]))"
# The dashboard's every GET that answers JSON (control/dashboard/app.py `_get_api`).
ENDPOINTS = ["/api/session", "/api/fleet", "/api/rollouts", "/api/groups", "/api/bundles", "/api/desired",
             "/api/quality", "/api/audit", f"/api/devices/{ATTACKER}/series", f"/api/devices/{NEIGHBOUR}/series",
             "/api/groups/line-1/series"]  # fmt: skip


@dataclass
class Plant:
    broker: SecureBroker
    plane: ControlPlane
    store_url: str
    token: str


@pytest.fixture
def plant(tmp_path: Path) -> Iterator[Plant]:
    pki = make_pki(tmp_path / "pki", [ATTACKER, NEIGHBOUR])
    with (
        SecureBroker(pki, {ATTACKER: [], NEIGHBOUR: []}) as broker,
        control_plane(broker.url, tmp_path, tls=pki.tls(HOST_IDENTITY), engine=False, http_port=0,
                      compact_every_s=0.5, quota_every_s=0.5, raw_retention_s=60.0) as plane,
    ):  # fmt: skip
        token = auth.issue_token(plane.store, "ops")
        yield Plant(broker, plane, f"sqlite://{tmp_path}/control.sqlite", token)


def strict(text: str | bytes) -> Any:
    """json.loads that refuses NaN and ±Infinity, as a browser's JSON.parse does."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def report(device: str, seq: int, **changes: Any) -> bytes:
    fields: dict[str, Any] = {
        "schema_version": 1, "device_id": device, "seq": seq, "ts": time.time(), "bundle_id": None,
        "provider": "cpu", "window_s": 1.0, "requests": 1, "errors": 0, "throughput_rps": 1.0,
        "latency": {"count": 1, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}, "golden_agreement": None,
        "golden_max_abs_error": None, "cpu_percent": 1.0, "rss_mb": 1.0,
    }  # fmt: skip
    fields.update(changes)
    return json.dumps(fields).encode()  # allow_nan: Infinity and NaN written as a hostile device would


def device(plant: Plant, name: str) -> Connection:
    conn = plant.broker.connect(name, client_id=name)
    hardware = Hardware(arch="x86_64", os="linux", cpu_count=2, memory_mb=1024, hostname="h")
    status = DeviceStatus(device_id=name, online=True, state="idle", groups=["line-1"], hardware=hardware)
    conn.publish(TOPICS.status(name), status.encode(), retain=True, wait=10)
    wait_until(f"{name} in the store", lambda: plant.plane.store.device(name), 30)
    return conn


def dashboard(plant: Plant) -> dict[str, tuple[int, bytes]]:
    answers = {}
    for path in ENDPOINTS:
        request = urllib.request.Request(plant.plane.dashboard_url.rstrip("/") + path,  # type: ignore[union-attr]
                                         headers={"Authorization": f"Bearer {plant.token}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            answers[path] = (response.status, response.read())
    return answers


def cli_json(plant: Plant, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", LAUNCH, *args, "--store", plant.store_url, "--json"],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def _handled(plant: Plant, count: int) -> None:
    counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
    wait_until(f"{count} reports handled", lambda: counts["received"] >= count, 60)
    assert plant.plane.ingestor.drain(30)  # type: ignore[union-attr]


def test_infinity_and_a_far_future_date_neither_blank_the_dashboard_nor_stay_latest(
    plant: Plant, attack_ledger: AttackLedger
) -> None:
    attacker, calm = device(plant, ATTACKER), device(plant, NEIGHBOUR)
    try:
        calm.publish(TOPICS.telemetry(NEIGHBOUR), report(NEIGHBOUR, 1), wait=10)
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 1), wait=10)
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 2, latency={
            "count": 1, "p50_ms": 1.0, "p95_ms": math.inf, "p99_ms": math.inf}), wait=10)  # fmt: skip
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 3, ts=1e15), wait=10)
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 4, ts=time.time() + 86400), wait=10)
        _handled(plant, 6)  # the two statuses and four reports
    finally:
        attacker.stop()
        calm.stop()
    store = plant.plane.store
    latest = store.latest_telemetry()[(ATTACKER, "default")]
    refused: list[str] = []
    for path, (status, body) in dashboard(plant).items():
        try:
            strict(body)
        except ValueError as err:
            refused.append(f"{path} ({status}): {err}")
    try:
        devices = strict(cli_json(plant, "devices", "list"))
        listed = len(devices.get("devices", devices)) if isinstance(devices, dict) else len(devices)
    except ValueError as err:
        refused.append(f"devices list --json: {err}")
        listed = 0
    counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
    assert not attack_ledger.record(
        "telemetry with p95_ms Infinity and ts=1e15 from one device certificate",
        bool(refused) or latest.seq != 1 or store.telemetry_count(ATTACKER) != 1 or listed < 2,
        f"not strict JSON: {refused or 'none'} (of {len(ENDPOINTS)} endpoints and devices list); the attacker's "
        f"latest report is seq {latest.seq}; refused out of range: {counts['out_of_range']}",
    )


def test_huge_old_dated_counters_are_refused_and_every_store_loop_completes(
    plant: Plant, attack_ledger: AttackLedger
) -> None:
    attacker, calm = device(plant, ATTACKER), device(plant, NEIGHBOUR)
    try:
        old = time.time() - 3 * 86400
        for seq in range(1, 4):
            attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, seq, ts=old + seq, requests=2**62),
                             wait=10)  # fmt: skip
        calm.publish(TOPICS.telemetry(NEIGHBOUR), report(NEIGHBOUR, 1, ts=time.time() - 120), wait=10)
        _handled(plant, 6)
    finally:
        attacker.stop()
        calm.stop()
    store = plant.plane.store
    since = time.time()

    def loops_completed() -> dict[str, Any] | None:
        rows = {r.component: r for r in store.repos.health.health() if r.holder == plant.plane.holder}
        done = all(rows[n].last_tick is not None and rows[n].last_tick > since for n in (COMPACTION, RETENTION, QUOTA))
        return rows if done else None

    rows = wait_until("compaction, retention and the quota to complete after the attack", loops_completed, 60)
    errors = {n: rows[n].last_error for n in (COMPACTION, RETENTION, QUOTA) if rows[n].errors_per_min}
    status = strict(subprocess.run(
        [sys.executable, "-c", LAUNCH, "control", "status", "--store", plant.store_url, "--json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout)  # fmt: skip
    shown = {r["component"]: r["state"] for r in status["loops"] if r["instance"] == plant.plane.holder}
    counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
    assert not attack_ledger.record(
        "three old-dated reports with requests = 2**62 from one device certificate",
        store.telemetry_count(ATTACKER) != 0 or bool(errors) or any(shown.get(n) != "ok" for n in
                                                                     (COMPACTION, RETENTION, QUOTA)),
        f"stored: {store.telemetry_count(ATTACKER)}; refused out of range: {counts['out_of_range']}; loop errors: "
        f"{errors or 'none'}; control status: {shown}; the neighbour's report downsampled: "
        f"{store.telemetry_count(NEIGHBOUR) == 0}",
    )  # fmt: skip


def test_negative_counters_and_minus_infinite_cpu_are_never_stored_nor_shown(
    plant: Plant, attack_ledger: AttackLedger
) -> None:
    attacker = device(plant, ATTACKER)
    try:
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 1, requests=-5, errors=-1), wait=10)
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 2, cpu_percent=-math.inf), wait=10)
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 3, cpu_percent=900.0), wait=10)  # 2 cores
        attacker.publish(TOPICS.telemetry(ATTACKER), report(ATTACKER, 4, rss_mb=-1.0, spool_dropped=-9), wait=10)
        _handled(plant, 5)
    finally:
        attacker.stop()
    fleet = strict(dashboard(plant)["/api/fleet"][1])
    shown = [d for d in fleet.get("devices", []) if d.get("device_id") == ATTACKER]
    figures = json.dumps(shown)
    counts = plant.plane.ingestor.stats.counts  # type: ignore[union-attr]
    assert not attack_ledger.record(
        "negative counters, -inf and 450 %-per-core CPU from one device certificate",
        plant.plane.store.telemetry_count(ATTACKER) != 0 or "-5" in figures or "-Infinity" in figures,
        f"stored: {plant.plane.store.telemetry_count(ATTACKER)}; refused out of range: {counts['out_of_range']}; "
        f"the fleet view shows the device with no report: {bool(shown)}",
    )
