"""Small models whose plain INT8 breaks a task bar, for the mixed-precision tests (their data included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def outlier_model(directory: Path, eval_count: int = 32, labels: np.ndarray | None = None) -> tuple[Path, Path, Path]:
    """Six MatMul+Add+Relu layers over a sequence ([1, 16, 8] → logits [1, 16, 10]); the third adds 400 to one
    channel the fourth ignores, so per-tensor INT8 activations after it swamp the channels that matter.
    Calibration: 32 samples; evaluation: `eval_count`, with `labels` when given."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, width = [], [], "x", 8
    for i in range(6):
        out = 10 if i == 5 else 32
        w = (rng.normal(size=(width, out)) / np.sqrt(width)).astype(np.float32)
        b = np.zeros(out, np.float32)
        b[0] = 400.0 if i == 2 else 0.0
        w[0] = 0.0 if i == 3 else w[0]
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"B{i}"], [f"a{i}"], name=f"add{i}")]  # fmt: skip
        prev, width = f"a{i}", out
        if i < 5:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["logits"], name="out"))
    graph = helper.make_graph(
        nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 16, 10])], inits,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), directory / "m.onnx")
    for name, seed, count in (("calib", 1, 32), ("eval", 2, eval_count)):
        x = np.random.default_rng(seed).normal(size=(count, 1, 16, 8)).astype(np.float32)
        extra = {"labels": labels} if labels is not None and name == "eval" else {}
        np.savez(directory / f"{name}.npz", x=x, **extra)
    return directory / "m.onnx", directory / "calib.npz", directory / "eval.npz"


def outlier_conv_model(directory: Path, depth: int = 6, eval_count: int = 32) -> tuple[Path, Path, Path]:
    """A 3x3 conv stack over an image ([1, 4, 12, 12] → per-position logits [1, 144, 10]): the first conv adds 300
    to one output channel that the second conv ignores, so per-tensor INT8 of that activation swamps the channels
    that matter; every later conv is benign. The one sensitive place is early; its error reaches every layer
    after it (the victims)."""
    rng = np.random.default_rng(3)
    inits, nodes, prev, width = [], [], "x", 4
    for i in range(depth):
        out = 10 if i == depth - 1 else 16
        w = (rng.normal(size=(out, width, 3, 3)) / np.sqrt(width * 9)).astype(np.float32)
        b = np.zeros(out, np.float32)
        if i == 0:
            b[0] = 300.0
        if i == 1:
            w[:, 0] = 0.0
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"W{i}", f"B{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        prev, width = f"c{i}", out
        if i < depth - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    inits.append(numpy_helper.from_array(np.array([1, 10, 144], np.int64), "shape"))
    nodes += [
        helper.make_node("Reshape", [prev, "shape"], ["flat"], name="flatten"),
        helper.make_node("Transpose", ["flat"], ["logits"], name="positions", perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes, "outlier_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 144, 10])], inits,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), directory / "m.onnx")
    for name, seed, count in (("calib", 1, 32), ("eval", 2, eval_count)):
        x = np.random.default_rng(seed).normal(size=(count, 1, 4, 12, 12)).astype(np.float32)
        np.savez(directory / f"{name}.npz", x=x)
    return directory / "m.onnx", directory / "calib.npz", directory / "eval.npz"
