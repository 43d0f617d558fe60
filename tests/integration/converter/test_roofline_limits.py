"""This machine's limits measured for real, side by side with the model they judge (converter.roofline): bursts of
the limits interleaved with the model's timing, and no share above 100 %, even against a peak planted low as if
cached on a busy machine."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter.roofline import Artifact, LimitsMeter, judge, machine_limits, remember
from edgefleet.converter.roofline import limits as limits_module
from edgefleet.converter.roofline.limits import machine_key

SIZE = 384  # a GEMM big enough to run near the rate the limit measures, small enough to time in milliseconds


def _gemm():
    weight = np.random.default_rng(0).standard_normal((SIZE, SIZE)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIZE, SIZE])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_limit_measured_beside_a_model_judges_it_at_most_100_percent_and_a_busy_low_cache_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits_module, "_MEMO", {})
    model = _gemm()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((SIZE, SIZE), np.float32)}
    key, cpu = machine_key(1)
    meter = LimitsMeter(1, key, cpu)
    best = float("inf")
    for _ in range(2):  # the model's timing and the limit's bursts interleaved, in the same window
        for _ in range(5):
            start = time.perf_counter()
            session.run(None, feeds)
            best = min(best, time.perf_counter() - start)
        meter.burst()
    measured = meter.limits()
    fp32 = measured.gemm_gops["onnxruntime"]["fp32"]
    assert fp32 > 0 and measured.bandwidth_gbs > 0 and measured.load_average >= 0

    # A figure cached as if at a load average of 5 on a 2-core machine, at a tenth of the real rate: measured again.
    planted = replace(measured, gemm_gops={"onnxruntime": {"fp32": fp32 / 10}}, load_average=5.0, cpus=2)
    remember(planted, tmp_path)
    monkeypatch.setattr(limits_module, "_MEMO", {})  # a new process: only the file is left
    monkeypatch.setattr(limits_module, "_REMEASURED", set())
    again = machine_limits(1, tmp_path)
    assert again.gemm_gops["onnxruntime"]["fp32"] > fp32 / 10 and again.measurements == 2

    # Judged against the low figure (as if it had been trusted), the model is at 100 % of a raised peak, not above.
    lines, raised = judge([Artifact("gemm", "onnxruntime", model, best * 1e3)], {"x": feeds["x"]}, planted)
    line = lines["gemm"]
    assert line["limit_pct"] <= 100.0 and line["compute_pct"] <= 100.0
    achieved = 2 * SIZE**3 / best / 1e9
    if achieved > fp32 / 10:  # the usual case: the model ran faster than a tenth of the GEMM rate
        assert line["limit_pct"] == pytest.approx(100.0) and line["raised"]
        assert raised is not None and raised.gemm_gops["onnxruntime"]["fp32"] == pytest.approx(achieved, rel=0.05)
    # Judged against the limit measured beside it, it is below 100 % unless it beat it, which then says so.
    lines, _ = judge([Artifact("gemm", "onnxruntime", model, best * 1e3)], {"x": feeds["x"]}, measured)
    assert 0 < lines["gemm"]["limit_pct"] <= 100.0
    assert (lines["gemm"]["limit_pct"] < 100.0) or lines["gemm"]["raised"]
