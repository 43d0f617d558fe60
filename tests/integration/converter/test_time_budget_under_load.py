"""The time budget is a promise about wall time on a busy machine: with two processes spinning on the cores, a
conversion whose full search takes minutes (a conv stack whose plain INT8 misses the bar, so calibrations, NNCF's
accuracy control and the mixed-precision search would all run) ends within 1.1x its budget plus the FP32 minimum,
ships FP32 or better, and its report lists what the budget cut."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.models.mixed import outlier_conv_model

BUDGET_S = 20.0
# What runs whatever the budget says, for this model (a 12x12 conv stack, milliseconds a sample): the calibration
# check, the FP32 reference (at most 15 % of the budget, at least 2 samples), the FP32 candidate's build and
# evaluation, then the bundle (golden set, signing) and the report. Each takes well under a second on an idle
# machine; 6 s leaves room for a 2-core machine loaded well past its two busy processes (load average 10 or more).
FP32_MINIMUM_S = 6.0


@pytest.fixture
def two_busy_processes() -> Iterator[None]:
    """Two processes spinning on the 2 cores for the length of the test, always stopped."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.serial  # the load is the two processes the test starts, not whatever else runs beside it
def test_a_conversion_keeps_its_time_budget_with_two_busy_processes_and_reports_what_it_cut(
    tmp_path: Path, signing_key: SigningKey, two_busy_processes: None
) -> None:
    model, calib, evaluation = outlier_conv_model(tmp_path / "model")
    # The libraries are imported before the clock starts: a first import of OpenVINO or NNCF on a loaded machine
    # takes 5-30 s, the same for any budget, and other tests in this process may have paid it already.
    import nncf  # noqa: F401
    import onnxruntime.quantization  # noqa: F401
    import onnxscript.optimizer  # noqa: F401
    import openvino  # noqa: F401

    request = ConvertRequest(
        model=model, profiles=[get_profile("intel-x86-vnni")], calib=calib, eval=evaluation, out=tmp_path / "out",
        key=signing_key, name="outlier", version="1", metric="per-position-agreement", min_score=0.95,
        time_budget_s=BUDGET_S,
    )  # fmt: skip
    started = time.monotonic()
    (result,) = convert(request)
    wall = time.monotonic() - started

    assert result.bundle, result.error
    assert wall <= 1.1 * BUDGET_S + FP32_MINIMUM_S, f"{wall:.1f} s for a {BUDGET_S:g} s budget"
    spent = result.time_budget
    assert spent is not None and spent["budget_s"] == BUDGET_S
    cut = spent["cut"]
    assert isinstance(cut, list) and cut, "a search this long must have been cut"
    # What is cut depends on the CPU: with VNNI the INT8 recipes are timed and the budget stops or skips some; on a
    # CPU without it (intel-x86-vnni judged by proxy) the search is shorter and the budget cut the machine's limits.
    assert all(isinstance(c["what"], str) and c["what"] and isinstance(c["how"], str) and c["how"] for c in cut), cut
    report = json.loads((tmp_path / "out" / "outlier-1.report.json").read_text())
    assert report["profiles"][0]["time_budget"]["cut"] == cut
    html = (tmp_path / "out" / "outlier-1.report.html").read_text()
    assert "what it cut" in html and cut[0]["what"] in html
