"""The time budget is a deadline that a build in progress keeps: each long pass (ONNX Runtime's INT8 calibration,
NNCF's statistics, NNCF's accuracy control, the evaluation of a candidate) stops between samples once it has
passed, with an error that says so, instead of finishing whatever it costs; the libraries in between do not
swallow it. With no deadline, or one still ahead, the same passes run to the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter import deadline
from edgefleet.converter.metrics import resolve
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.nncf_accuracy import AccuracyControlConfig, quantize_with_accuracy_control
from edgefleet.converter.runners import ort_runner, predict
from edgefleet.core.tensors import Dataset


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(32, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w1, w2],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


DATA = Dataset({"x": np.random.default_rng(1).normal(size=(8, 1, 16)).astype(np.float32)}, None)


@contextmanager
def _past_deadline() -> Iterator[None]:
    with deadline.until(time.monotonic() - 1.0, 30.0):
        yield


def test_outside_a_deadline_checking_costs_nothing_and_raises_nothing() -> None:
    deadline.check()
    with deadline.until(None, 30.0):
        deadline.check()
    with deadline.until(time.monotonic() + 3600, 30.0):
        deadline.check()


def test_a_passed_deadline_raises_an_error_that_names_the_budget_and_the_way_out() -> None:
    with _past_deadline(), pytest.raises(deadline.TimeBudgetSpent, match=r"time budget \(30 s\).*--time-budget"):
        deadline.check()
    deadline.check()  # the context is left: no deadline again


def test_onnx_runtime_int8_calibration_stops_at_the_deadline() -> None:
    config = prec.StaticConfig()
    assert prec.quantize_int8_static(_mlp(), config, DATA).graph.node  # no deadline: it runs to the end
    with _past_deadline(), pytest.raises(deadline.TimeBudgetSpent):
        prec.quantize_int8_static(_mlp(), config, DATA)


def test_nncf_statistics_stop_at_the_deadline() -> None:
    artifact = ovp.export_openvino(_mlp())
    assert ovp.quantize_nncf(artifact, ovp.NNCFConfig(subset_size=8), DATA).model is not None
    with _past_deadline(), pytest.raises(deadline.TimeBudgetSpent):
        ovp.quantize_nncf(artifact, ovp.NNCFConfig(subset_size=8), DATA)


def test_nncf_accuracy_control_stops_at_the_deadline() -> None:
    artifact = ovp.export_openvino(_mlp())
    reference = predict(ort_runner(_mlp()), DATA)
    metric = resolve("sqnr-db")

    def score(index: int, want: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
        return float(metric(want, got, None))

    config = AccuracyControlConfig(max_drop=100.0, subset_size=8)
    with _past_deadline(), pytest.raises(deadline.TimeBudgetSpent):
        quantize_with_accuracy_control(artifact, config, DATA, DATA, reference, score)


def test_the_evaluation_of_a_candidate_stops_at_the_deadline() -> None:
    runner = ort_runner(_mlp())
    assert predict(runner, DATA)["y"].shape == (8, 1, 4)
    with _past_deadline(), pytest.raises(deadline.TimeBudgetSpent):
        predict(runner, DATA)
