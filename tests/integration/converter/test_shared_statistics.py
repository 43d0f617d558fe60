"""Calibration statistics are collected once per model, data and calibration method, and shared by the INT8
candidates built from them: a variant that only keeps other layers in float reads no calibration sample and gets
the same scales as if it had calibrated itself; another method, or other data, calibrates again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter.passes import precision as prec
from edgefleet.core.tensors import Dataset


def _cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(4, 8, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])], [w1, w2],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


class _Counted(Dataset):
    """A dataset that counts the samples read from it."""

    reads = 0

    def sample(self, index: int) -> dict[str, np.ndarray]:
        type(self).reads += 1
        return super().sample(index)


def _data(seed: int) -> Dataset:
    return Dataset({"x": np.random.default_rng(seed).normal(size=(6, 1, 3, 16, 16)).astype(np.float32)}, None)


def _scales(model: onnx.ModelProto) -> dict[str, float]:
    """Each activation's quantization scale, by the tensor it quantizes."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {
        n.input[0]: float(inits[n.input[1]])
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[1] in inits and inits[n.input[1]].size == 1
    }


def test_a_variant_with_layers_in_float_reuses_the_statistics_and_gets_the_same_scales(tmp_path: Path) -> None:
    statistics = tmp_path / "calibration"
    data = _data(1)
    _Counted.reads = 0
    counted = _Counted(data.inputs, None)
    first = prec.quantize_int8_static(_cnn(), prec.StaticConfig(), counted, statistics)
    after_first = _Counted.reads
    variant = prec.quantize_int8_static(_cnn(), prec.StaticConfig(exclude_nodes=("conv2",)), counted, statistics)
    assert len(list(statistics.iterdir())) == 1
    # The first reads every sample twice (the statistics' key hashes them, the calibrator runs them); the variant
    # only hashes them: its calibrator runs none.
    assert after_first == 2 * len(data) and _Counted.reads - after_first == len(data)
    alone = prec.quantize_int8_static(_cnn(), prec.StaticConfig(exclude_nodes=("conv2",)), data)
    shared, own = _scales(variant), _scales(alone)
    assert shared and shared == own
    assert set(_scales(first)) > set(shared)  # the variant keeps conv2's input in float


def test_another_method_or_other_data_calibrates_again(tmp_path: Path) -> None:
    statistics = tmp_path / "calibration"
    prec.quantize_int8_static(_cnn(), prec.StaticConfig(), _data(1), statistics)
    prec.quantize_int8_static(_cnn(), prec.StaticConfig(calibration="percentile"), _data(1), statistics)
    prec.quantize_int8_static(_cnn(), prec.StaticConfig(), _data(2), statistics)
    assert len(list(statistics.iterdir())) == 3
