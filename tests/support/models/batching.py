"""Real ONNX models for the batching tests: the digits CNN with a symbolic batch dimension, and one whose output is
not one row per input row (a batch-wide mean, declared as per-row: what batching must detect)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from support.paths import DIGITS

Feeds = dict[str, np.ndarray]


def digits_any_batch(path: Path) -> Path:
    """models/digits/digits_cnn.onnx with its batch dimension named `N` (the CNN computes any batch)."""
    model = onnx.load(str(DIGITS / "digits_cnn.onnx"))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(path))
    return path


def batch_mean(path: Path) -> Path:
    """y = mean of x over the batch (keepdims): declared [N, 4], it answers [1, 4] whatever the batch."""
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        [node], "batch-mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [axes],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def session_run(path: Path, threads: int = 1) -> Callable[[Feeds], Feeds]:
    """A real ONNX Runtime session's run, as a model's unchecked run: feeds in, outputs by name out."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))


def digits_samples(count: int, seed: int = 0) -> np.ndarray:
    """`count` evaluation digits, each [1, 1, 8, 8] float32 (a request's input)."""
    data = np.load(DIGITS / "eval.npz")["input"]
    rng = np.random.default_rng(seed)
    return data[rng.choice(len(data), count, replace=False)].astype(np.float32)
