"""bench/fleet.py still runs end to end (a small fleet): nothing acknowledged is lost, the rollout succeeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fleet.py"


@pytest.mark.slow
def test_the_fleet_benchmark_runs_and_loses_nothing() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--agents", "60", "--duration", "3", "--rollout-devices", "10",
         "--bundle-mb", "1", "--json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["registered"] == 60
    assert report["telemetry"]["lost"] == 0 and report["telemetry"]["acked"] > 0
    assert report["rollout"]["rollout_state"] == "succeeded" and report["rollout"]["committed"] == 10
