"""bench/fleet.py still runs end to end (a small fleet growing in two steps, on both backends, two control-plane
instances): nothing acknowledged is lost or stored twice, every group change reaches every device, the rollout
succeeds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.paths import REPO

BENCH = REPO / "bench" / "fleet.py"


@pytest.mark.slow
@pytest.mark.timeout(700)  # the benchmark's own process is allowed 600 s (93 to 110 s in full runs here)
def test_the_fleet_benchmark_runs_and_loses_nothing() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--steps", "30,60", "--per-proc", "30", "--duration", "3",
         "--rollout-devices", "10", "--bundle-mb", "1", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout)["results"]
    assert [r["backend"] for r in reports] == ["sqlite", "postgresql"]
    for report in reports:
        assert [s["registered"] for s in report["steps"]] == [30, 60]
        for step in report["steps"]:
            change = step["group_change"]
            assert change["all_published"] and change["all_committed"], change
            assert step["steady"]["store_write_p95_ms"] is not None and step["steady"]["reports_per_s_stored"] > 0
        telemetry = report["telemetry"]
        assert telemetry["lost"] == 0 and telemetry["stored_twice"] == 0 and telemetry["acked"] > 0, telemetry
        assert report["bundle"]["rollout_state"] == "succeeded" and report["bundle"]["committed"] == 10
