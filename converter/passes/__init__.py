"""The pass registry: every graph, precision and export pass, with what it needs and what it suits.

A pass is a pure function (model, config) → new model; the input is never mutated. The registry lists
passes without importing their heavy dependencies (openvino, nncf, onnxscript are imported inside them),
so tools can filter passes by runtime, precision or package before running anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from edgefleet.converter.passes import coreml, custom_ops, graph, nncf_accuracy, openvino, precision, tensorrt, web
from edgefleet.converter.passes.ort import PassResult, optimize_portable

__all__ = ["PASSES", "PassInfo", "PassResult", "optimize_portable"]

Kind = Literal["graph", "precision", "export"]


@dataclass(frozen=True)
class PassInfo:
    name: str
    kind: Kind
    summary: str
    function: Callable[..., Any]
    needs: tuple[str, ...]  # Python packages the pass imports
    runtimes: tuple[str, ...]  # runtimes whose bundles it suits ("*" = any)
    precisions: tuple[str, ...] = ("*",)  # the precision recipe it produces or suits
    needs_calibration: bool = False
    portable: bool = True  # output is standard ONNX every runtime reads


_ANY = ("*",)
PASSES: dict[str, PassInfo] = {
    p.name: p
    for p in [
        PassInfo("pin-inputs", "graph", "declared-constant inputs become initializers", graph.pin_inputs,
                 ("onnx",), _ANY),
        PassInfo("fix-dims", "graph", "symbolic dimensions or whole input shapes fixed to values", graph.fix_dims,
                 ("onnx",), _ANY),
        PassInfo("convert-opset", "graph", "default-domain opset moved into the profile's range",
                 graph.convert_opset, ("onnx",), _ANY),
        PassInfo("shape-inference", "graph", "ONNX shape inference plus ONNX Runtime's symbolic inference",
                 graph.infer_shapes, ("onnx", "onnxruntime"), _ANY),
        PassInfo("fold-constants", "graph", "constant folding, constant-If inlining, dead code removal",
                 graph.fold_constants, ("onnxscript",), _ANY),
        PassInfo("fuse-conv-bn", "graph", "BatchNormalization folded into the preceding Conv",
                 graph.fuse_conv_bn, ("onnx", "numpy"), _ANY),
        PassInfo("remove-redundant", "graph", "no-op Identity/Dropout/Cast/Transpose/Reshape removed, chains merged",
                 graph.remove_redundant, ("onnx",), _ANY),
        PassInfo("ort-basic-optimization", "graph", "ONNX Runtime BASIC level saved offline (portable subset)",
                 optimize_portable, ("onnxruntime",), _ANY),
        PassInfo("fp16", "precision", "float tensors to float16, IO kept float32, block list honoured",
                 precision.to_fp16, ("onnxruntime",), ("onnxruntime",), ("fp16",)),
        PassInfo("int8-dynamic", "precision", "dynamic INT8 for MatMul/Gemm (never Conv: ConvInteger is slow)",
                 precision.quantize_int8_dynamic, ("onnxruntime",), ("onnxruntime",), ("int8-dynamic",),
                 portable=False),
        PassInfo("int8-static-qdq", "precision", "static INT8 QDQ: per-channel, MinMax/Percentile/Entropy",
                 precision.quantize_int8_static, ("onnxruntime",), ("onnxruntime", "onnxruntime-web"),
                 ("int8-static",), needs_calibration=True),
        PassInfo("openvino-ir", "export", "OpenVINO IR (.xml + .bin) with the inference precision hint",
                 openvino.export_openvino, ("openvino",), ("openvino",), ("fp32", "fp16")),
        PassInfo("nncf-int8", "precision", "NNCF post-training INT8 on the OpenVINO model",
                 openvino.quantize_nncf, ("nncf", "openvino"), ("openvino",), ("int8-static",),
                 needs_calibration=True),
        PassInfo("nncf-int8-accuracy-control", "precision", "NNCF INT8 with the layers that cost the task metric "
                 "most put back into float until it meets the bar (quantize_with_accuracy_control)",
                 nncf_accuracy.quantize_with_accuracy_control, ("nncf", "openvino"), ("openvino",), ("int8-static",),
                 needs_calibration=True),
        PassInfo("decompose-custom-ops", "graph", "known custom ops inlined as standard-op ONNX functions",
                 custom_ops.decompose, ("onnx",), _ANY),
        PassInfo("coreml-mlprogram", "export", "ONNX → onnx2torch → coremltools ML Program (.mlpackage), "
                 "FP16/FP32 compute, optional int8 linear weight quantization", coreml.export_mlpackage,
                 ("torch", "onnx2torch", "coremltools"), ("coreml",), ("fp16", "fp32", "int8-weights"),
                 portable=False),
        PassInfo("tensorrt-calibration-table", "export", "INT8 calibration table for the TensorRT EP "
                 "(onnxruntime write_calibration_table, symmetric MinMax)", tensorrt.write_calibration_table,
                 ("onnxruntime",), ("onnxruntime",), ("int8-static",), needs_calibration=True),
        PassInfo("web-check", "export", "operators checked against onnxruntime-web's WASM EP, IR version capped",
                 web.for_web, ("onnx", "onnxruntime"), ("onnxruntime-web",)),
        PassInfo("ort-format", "export", "ONNX Runtime's ORT format (basic optimizations only)", web.to_ort_format,
                 ("onnxruntime",), ("onnxruntime-web",), portable=False),
    ]
}  # fmt: skip


def passes_for(runtime: str, precision_name: str | None = None) -> list[PassInfo]:
    """Passes that suit a runtime (and optionally a precision)."""
    return [
        p
        for p in PASSES.values()
        if ("*" in p.runtimes or runtime in p.runtimes)
        and (precision_name is None or "*" in p.precisions or precision_name in p.precisions)
    ]
