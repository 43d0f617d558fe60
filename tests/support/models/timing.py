"""Models whose run time is known by construction, for the timing and pruning tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def matmul_chain(size: int, depth: int) -> onnx.ModelProto:
    """`depth` MatMuls of a [1, size] vector by one [size, size] weight: the run time grows with `depth`."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [size, size], np.full(size * size, 0.001, np.float32))
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}"]) for i in range(depth)]
    nodes.append(helper.make_node("Identity", [f"h{depth}"], ["y"]))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], [weight],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
