"""How near the limit a candidate runs: work counted from its graph, this machine's limits measured and cached, and
the roofline that sets one against the other."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.roofline import MachineLimits, Work, machine_limits, onnx_work, openvino_work, roofline
from edgefleet.converter.roofline import limits as limits_module
from edgefleet.core.tensors import Dataset

CONV_MACS = 4 * 8 * 8 * 3 * 3 * 3  # output elements x weight elements per output channel
MATMUL_MACS = 256 * 10  # [1, 256] x [256, 10]


def _conv_matmul() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((256, 10)).astype(np.float32), "m"),
        numpy_helper.from_array(np.array([1, 256], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "m"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv-matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _data(count: int = 16) -> Dataset:
    return Dataset({"x": np.random.default_rng(1).standard_normal((count, 1, 3, 8, 8)).astype(np.float32)}, None)


FEEDS = {"x": np.zeros((1, 3, 8, 8), np.float32)}


def test_a_float_graph_counts_its_macs_by_op_and_the_rest_as_other_operations() -> None:
    work = onnx_work(_conv_matmul(), FEEDS)
    assert work.macs == {"Conv": CONV_MACS, "MatMul": MATMUL_MACS}
    assert work.macs_by_precision == {"fp32": CONV_MACS + MATMUL_MACS}
    assert work.other_ops == 4 * 8 * 8  # the Relu; the Reshape is plumbing
    assert work.flops == 2 * (CONV_MACS + MATMUL_MACS) + 4 * 8 * 8
    assert work.weight_bytes == (108 + 4 + 2560) * 4 + 2 * 8
    # conv reads x, writes c; relu reads c, writes r; reshape reads r, writes f; matmul reads f, writes y
    assert work.activation_bytes == 4 * (192 + 256 + 256 + 256 + 256 + 256 + 256 + 10)
    assert not work.unknown


def test_a_qdq_graph_counts_its_convolution_and_matmul_as_int8_and_moves_fewer_bytes() -> None:
    model = prec.quantize_int8_static(_conv_matmul(), prec.StaticConfig(), _data())
    work = onnx_work(model, FEEDS)
    assert work.macs_by_precision == {"int8": CONV_MACS + MATMUL_MACS}
    assert work.activation_bytes < onnx_work(_conv_matmul(), FEEDS).activation_bytes


def test_dynamic_int8_counts_its_integer_matmul_as_int8_and_leaves_the_convolution_in_float() -> None:
    model = prec.quantize_int8_dynamic(_conv_matmul(), prec.DynamicConfig(op_types=("MatMul",)))
    work = onnx_work(model, FEEDS)
    assert work.macs_by_precision == {"fp32": CONV_MACS, "int8": MATMUL_MACS}
    assert "MatMulInteger" in work.macs


def test_shapes_inference_cannot_reach_are_read_from_one_run() -> None:
    model = _conv_matmul()
    shape = helper.make_node("Shape", ["x"], ["dims"], name="dims")  # the Reshape's target now comes from data
    take = helper.make_node("Gather", ["dims", "zero"], ["n"], axis=0, name="n")
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "minus"))
    concat = helper.make_node("Concat", ["n", "minus"], ["shape2"], axis=0, name="cat")
    model.graph.node.insert(0, shape)
    model.graph.node.insert(1, take)
    model.graph.node.insert(2, concat)
    for node in model.graph.node:
        if node.op_type == "Reshape":
            node.input[1] = "shape2"
    work = onnx_work(model, FEEDS)
    assert work.macs == {"Conv": CONV_MACS, "MatMul": MATMUL_MACS}


def test_openvino_counts_the_same_work_and_nncf_int8_as_int8() -> None:
    model = _conv_matmul()
    artifact = ovp.export_openvino(model, ovp.OpenVINOConfig("f32"))
    plain = openvino_work(artifact.model, FEEDS, "f32")
    assert plain.total_macs == CONV_MACS + MATMUL_MACS and plain.macs_by_precision == {"fp32": plain.total_macs}
    assert openvino_work(artifact.model, FEEDS, "bf16").macs_by_precision == {"bf16": plain.total_macs}
    quantized = ovp.quantize_nncf(artifact, ovp.NNCFConfig(), _data())
    int8 = openvino_work(quantized.model, FEEDS, "f32")
    assert int8.macs_by_precision.get("int8", 0) > 0
    # The weights' FakeQuantize subgraphs fold when compiled: their outputs are no activation traffic (counted as
    # such, an INT8 MiniLM moved 18x its weights a run, "287 % of the bandwidth limit"), and INT8 moves fewer bytes.
    assert int8.activation_bytes <= plain.activation_bytes and int8.weight_bytes < plain.weight_bytes


LIMITS = MachineLimits(
    cpu="test", threads=2, gemm_gops={"onnxruntime": {"fp32": 100.0, "int8": 400.0}}, bandwidth_gbs=10.0,
    measured_at="", seconds=0.0, key="k",
)  # fmt: skip


def test_the_roofline_sets_each_precisions_macs_against_its_rate_and_the_bytes_against_the_bandwidth() -> None:
    work = Work(macs={"Conv": 3_000_000}, macs_by_precision={"int8": 2_000_000, "fp32": 1_000_000},
                weight_bytes=50_000, activation_bytes=50_000)  # fmt: skip
    line = roofline(work, "onnxruntime", LIMITS, latency_ms=0.1)
    assert line.compute_ms == pytest.approx(1e3 * (2 * 2e6 / 400e9 + 2 * 1e6 / 100e9))  # 0.03 ms
    assert line.memory_ms == pytest.approx(1e3 * 1e5 / 10e9)  # 0.01 ms
    assert line.bound == "compute" and line.limit_pct == pytest.approx(30.0)
    assert line.compute_pct == pytest.approx(30.0) and line.bandwidth_pct == pytest.approx(10.0)
    assert line.achieved_gops == pytest.approx(6e6 / 1e-4 / 1e9)
    # A precision without a figure runs at the FP32 rate, and the report says so.
    fp16 = roofline(Work(macs={"MatMul": 10}, macs_by_precision={"fp16": 10}), "onnxruntime", LIMITS, 1.0)
    assert fp16.peaks_gops == {"fp16 (as fp32)": 100.0}
    assert roofline(work, "onnxruntime", LIMITS, latency_ms=None).limit_pct is None


def test_this_machines_limits_are_measured_once_per_cpu_and_threads_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits_module, "_MEMO", {})
    monkeypatch.setattr(limits_module.os, "getloadavg", lambda: (0.1, 0.1, 0.1))  # a quiet machine's figure
    first = machine_limits(1, tmp_path)
    rates = first.gemm_gops["onnxruntime"]
    assert rates["fp32"] > 0 and rates["int8"] > 0 and first.bandwidth_gbs > 0 and first.threads == 1
    (cached,) = (tmp_path / "machine-limits").glob("*.json")
    assert json.loads(cached.read_text())["key"] == first.key

    def measured_again(*_args: object) -> MachineLimits:
        raise AssertionError("the limits were measured again")

    monkeypatch.setattr(limits_module, "measure", measured_again)
    monkeypatch.setattr(limits_module, "_MEMO", {})  # a new process: only the file is left
    assert machine_limits(1, tmp_path) == first
    assert limits_module.machine_key(2)[0] != first.key  # another thread count is another machine limit
