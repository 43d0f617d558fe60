"""The main job, end to end: `edgefleet demo` on a real Mosquitto and on the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.servers.brokers import MosquittoBroker


def _run_demo(tmp_path: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "edgefleet", "demo", "--json", "--workdir", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _assert_fleet_healthy(report: dict) -> None:
    devices = report["devices"]
    assert [d["device_id"] for d in devices] == ["demo-1", "demo-2", "demo-3"]
    for device in devices:
        assert device["verified"] is True and device["state"] == "serving"
        assert device["accuracy"] >= 0.95
        assert device["provider"] in ("CPUExecutionProvider", "OpenVINOExecutionProvider", "openvino:CPU")
        assert device["requests"] >= 360 and device["p50_ms"] > 0 and device["p95_ms"] >= device["p50_ms"]
        assert device["bundle"].startswith(f"digits-cnn-1-{device['profile']}-")
    assert {d["profile"] for d in devices} == {"intel-x86-vnni", "generic-x86-64"}


@pytest.mark.slow
def test_demo_on_mosquitto(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    report = _run_demo(tmp_path, "--broker", mosquitto.url)
    assert report["broker"] == mosquitto.url
    _assert_fleet_healthy(report)


def test_demo_on_the_embedded_broker(tmp_path: Path) -> None:
    report = _run_demo(tmp_path)
    assert report["broker"].startswith("mqtt://127.0.0.1:")
    _assert_fleet_healthy(report)
