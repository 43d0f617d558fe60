"""An edgefleet custom-op package: `edgefleet.ops::Swish`, the activation x * sigmoid(beta * x).

One file holds everything the pipeline needs about the operator; each side reads only its part:

- the device (agent) runs `compute` through onnxruntime-extensions (numpy in, numpy out);
- the converter runs `compute` for the FP32 reference on the host, and inlines `decomposition` (standard ONNX
  ops) where a target cannot load custom operators (OpenVINO, CoreML, TensorRT-only paths, the browser);
- `make.py` exports the torch model with the op in its own domain (register_custom_op_symbolic).

Name this file in $EDGEFLEET_CUSTOM_OPS (or register the module under the `edgefleet.custom_ops` entry point)
for both the converter and the agent. It imports numpy only (onnx lazily, in `decomposition`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DOMAIN = "edgefleet.ops"
VERSION = 1
DEFAULT_BETA = 1.0


def swish(x: np.ndarray, beta: float = DEFAULT_BETA) -> np.ndarray:
    """x * sigmoid(beta * x), written with tanh so that large |x| never overflows exp."""
    x = np.asarray(x, dtype=np.float32)
    return (x * (0.5 + 0.5 * np.tanh(0.5 * np.float32(beta) * x))).astype(np.float32)


class Swish:
    """The operator definition the converter and the agent read (see converter/passes/custom_ops.py)."""

    domain = DOMAIN
    op_type = "Swish"
    since_version = VERSION
    inputs = ("float",)
    outputs = ("float",)
    attributes = {"beta": "float"}  # noqa: RUF012 - read-only declaration

    @staticmethod
    def compute(x: np.ndarray, **attributes: object) -> np.ndarray:
        return swish(x, float(attributes.get("beta", DEFAULT_BETA)))  # type: ignore[arg-type]

    @staticmethod
    def decomposition(opset: int) -> onnx.FunctionProto:
        """Swish in standard ops: Y = X * Sigmoid(X * beta), beta taken from the node's attribute."""
        from onnx import helper

        beta = helper.make_node("Constant", [], ["beta"], value_float=DEFAULT_BETA)
        beta.attribute[0].ref_attr_name = "beta"  # the Constant takes the calling node's `beta`
        nodes = [
            beta,
            helper.make_node("Mul", ["X", "beta"], ["scaled"]),
            helper.make_node("Sigmoid", ["scaled"], ["gate"]),
            helper.make_node("Mul", ["X", "gate"], ["Y"]),
        ]
        return helper.make_function(
            DOMAIN,
            "Swish",
            ["X"],
            ["Y"],
            nodes,
            [helper.make_opsetid("", opset)],
            attribute_protos=[helper.make_attribute("beta", DEFAULT_BETA)],
        )


EDGEFLEET_CUSTOM_OPS = [Swish]
