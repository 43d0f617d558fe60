"""Browser bundles for onnxruntime-web: operators checked against the WASM EP, the IR version capped at what
onnxruntime-web reads, an optional ORT-format model, and the golden set as JSON for the page.

The WASM execution provider is ONNX Runtime's CPU kernels compiled to WebAssembly (onnxruntime-web's full build
includes the ai.onnx.ml and com.microsoft kernels too), so an operator is supported when this onnxruntime's CPU EP
registers a kernel for it at the model's opset. Custom operators cannot be loaded in the browser. The versions
below were measured against the onnxruntime-web release that deploy/web vendors (deploy/web/package.json).
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgefleet.converter.onnx_graph import walk_nodes
from edgefleet.converter.passes.graph import copy_model
from edgefleet.core.bundle.manifest import GoldenSpec
from edgefleet.core.errors import ConversionError
from edgefleet.core.quality.golden import GoldenSet

ORT_WEB_VERSION = "1.30.0"  # deploy/web/package.json pins the same
MAX_IR_VERSION = 13  # onnxruntime-web 1.30 refuses IR 14 ("Unsupported model IR version")
GOLDEN_JSON = "golden.json"
GOLDEN_JSON_VERSION = 1


@cache
def _kernels() -> dict[tuple[str, str], list[tuple[int, int]]]:
    from onnxruntime.capi import _pybind_state

    found: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for kernel in getattr(_pybind_state, "get_all_opkernel_def", list)():
        if kernel.provider == "CPUExecutionProvider":
            domain = "" if kernel.domain == "ai.onnx" else kernel.domain
            found[(domain, kernel.op_name)].append(tuple(kernel.version_range))
    return dict(found)


def wasm_unsupported(model: onnx.ModelProto) -> dict[str, str]:
    """Operator → why the WASM EP cannot run it (empty when every node has a kernel at the model's opset)."""
    kernels = _kernels()
    if not kernels:
        return {}
    opsets = {("" if imp.domain == "ai.onnx" else imp.domain): int(imp.version) for imp in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    missing: dict[str, str] = {}
    for node, _ in walk_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        key = f"{domain}::{node.op_type}" if domain else node.op_type
        if key in missing or (domain, node.op_type) in local:
            continue
        ranges = kernels.get((domain, node.op_type))
        if ranges is None:
            missing[key] = "no WASM kernel (custom operators cannot be loaded in the browser)"
            continue
        version = opsets.get(domain, 0)
        # Kernel version ranges are contiguous and inclusive; the newest one ends at INT_MAX.
        if not any(low <= version <= high for low, high in ranges):
            missing[key] = f"no WASM kernel at opset {version} (kernels cover {sorted(ranges)[0][0]}+)"
    return missing


@dataclass(frozen=True)
class WebConfig:
    max_ir_version: int = MAX_IR_VERSION


def for_web(model: onnx.ModelProto, config: WebConfig = WebConfig()) -> onnx.ModelProto:
    """A copy onnxruntime-web can read: the IR version capped (the graph uses nothing newer than its opset)."""
    missing = wasm_unsupported(model)
    if missing:
        listed = "; ".join(f"{op}: {why}" for op, why in sorted(missing.items()))
        raise ConversionError(f"onnxruntime-web's WASM EP cannot run {listed}")
    out = copy_model(model)
    out.ir_version = min(out.ir_version, config.max_ir_version)
    return out


def to_ort_format(onnx_path: Path, ort_path: Path) -> None:
    """ONNX Runtime's ORT format with only the basic (portable) optimizations baked in."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(ort_path)
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped exceptions
        raise ConversionError(f"ORT-format conversion failed: {str(err).splitlines()[0][:300]}") from err
    if not ort_path.is_file():
        raise ConversionError("ORT-format conversion wrote no file")


def _tensor(array: np.ndarray) -> dict[str, Any]:
    little = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": base64.b64encode(little.tobytes()).decode()}


def golden_json(golden: GoldenSet, spec: GoldenSpec) -> dict[str, Any]:
    """The golden set for the browser page: per sample, each input; per output, the expected and FP32 outputs
    stacked over samples; the tolerances the device applies (edgefleet.core.quality.golden.compare)."""
    count = len(golden.inputs)
    return {
        "version": GOLDEN_JSON_VERSION,
        "count": count,
        "max_abs_error": spec.max_abs_error,
        "min_agreement": spec.min_agreement,
        "inputs": [{name: _tensor(np.asarray(a[i])) for name, a in golden.inputs.inputs.items()} for i in range(count)],
        "expected": {name: _tensor(arr) for name, arr in golden.expected.items()},
        "reference": {name: _tensor(arr) for name, arr in golden.reference.items()},
        "labels": golden.inputs.labels.tolist() if golden.inputs.labels is not None else None,
    }


def write_golden_json(golden: GoldenSet, spec: GoldenSpec, path: Path) -> None:
    path.write_text(json.dumps(golden_json(golden, spec), separators=(",", ":")), "utf-8")
