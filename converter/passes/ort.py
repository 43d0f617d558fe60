"""ONNX Runtime's BASIC graph optimizations, saved offline.

Only BASIC is saved: ORT's EXTENDED and LAYOUT levels emit `com.microsoft` fused ops that other runtimes
cannot read. BASIC does constant folding, redundant Identity/Cast/Transpose removal and Conv+BatchNorm /
Conv+Add / Conv+Mul fusion; the device's runtime applies the hardware-specific fusions when it loads the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from edgefleet.converter.onnx_graph import count_ops, graph_nodes
from edgefleet.core.custom_ops.packages import STANDARD_DOMAINS
from edgefleet.core.errors import ConversionError


@dataclass(frozen=True)
class PassResult:
    path: Path
    ops_before: dict[str, int]
    ops_after: dict[str, int]

    @property
    def summary(self) -> str:
        removed = {op: n - self.ops_after.get(op, 0) for op, n in self.ops_before.items()}
        gone = ", ".join(f"{n} {op}" for op, n in sorted(removed.items()) if n > 0)
        return f"removed {gone}" if gone else "no change"


def optimize_portable(source: Path, out: Path) -> PassResult:
    """Constant folding, cleanup and Conv+BN fusion via ORT's BASIC offline optimization (file in, file out)."""
    model = onnx.load(str(source), load_external_data=False)
    before = count_ops(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped exceptions
        raise ConversionError(f"onnxruntime cannot load {source.name} for optimization: {err}") from err
    optimized = onnx.load(str(out))
    custom = {imp.domain for imp in model.opset_import} - STANDARD_DOMAINS
    foreign = sorted({n.domain for n in graph_nodes(optimized.graph)} - STANDARD_DOMAINS - custom)
    if foreign:
        raise ConversionError(f"optimization introduced non-portable domains {foreign}")
    return PassResult(out, before, count_ops(optimized))
