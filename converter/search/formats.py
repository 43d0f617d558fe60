"""The formats whose candidates are more than a model file: onnxruntime-web (WASM-checked, optionally the ORT
format), TensorRT (the graph as shipped, EP options, calibration table and a CPU proxy) and CoreML (an ML Program
package, checked against ONNX Runtime through torch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from edgefleet.converter.onnx_graph import graph_inputs
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.passes import web
from edgefleet.converter.runners import predict
from edgefleet.converter.search.request import SearchRequest
from edgefleet.converter.search.types import COREML_PACKAGE, MODEL_DIR, Built, Spec
from edgefleet.core.bundle.manifest import PassRecord
from edgefleet.core.errors import ConversionError

TORCH_MATCH_TOLERANCE = 1e-3  # onnx2torch's module vs ONNX Runtime, relative to the largest output magnitude


def finish_web(model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    """onnxruntime-web: operators checked against the WASM EP, IR capped, optionally the ORT format."""
    out = web.for_web(model)
    path = directory / "model.onnx"
    onnx.save(out, str(path))
    built.passes.append(
        PassRecord(
            name="web-check",
            params={"onnxruntime_web": web.ORT_WEB_VERSION, "wasm_ops": "ok", "ir_version": int(out.ir_version)},
        )
    )
    if not spec.ort_format:
        built.files = {f"{MODEL_DIR}/model.onnx": path}
        return
    ort_path = directory / "model.ort"
    web.to_ort_format(path, ort_path)
    built.passes.append(PassRecord(name="ort-format", params={"optimization": "basic"}))
    built.files = {f"{MODEL_DIR}/model.ort": ort_path}


def make_tensorrt(request: SearchRequest, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    """The FP32 graph as shipped, the EP options, the INT8 calibration table, and the CPU proxy."""
    assert isinstance(spec.config, trt.TensorRTConfig)
    config = spec.config
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    built.files = {f"{MODEL_DIR}/model.onnx": path}
    table_rel = None
    if config.precision == "int8-static":
        table = trt.write_calibration_table(model, request.calib, directory / "calibration", config.max_samples)
        table_rel = f"{MODEL_DIR}/{trt.CALIBRATION_TABLE}"
        built.files[table_rel] = table
        built.passes.append(
            PassRecord(
                name="tensorrt-calibration-table",
                params={"method": "minmax", "symmetric": True, "samples": min(len(request.calib), config.max_samples)},
            )
        )
    built.tensorrt = config.options(table_rel)
    built.passes.append(PassRecord(name="tensorrt-ep-options", params=config.params()))
    lacking = trt.unsupported_ops(model)
    if lacking:
        built.notes.append(
            f"TensorRT's ONNX parser cannot take {', '.join(lacking)}: those nodes run on the CUDA/CPU EPs"
        )
    proxy = trt.proxy_model(model, config, request.calib)
    if proxy is not model:
        built.proxy = directory / "proxy.onnx"
        onnx.save(proxy, str(built.proxy))


def make_coreml(request: SearchRequest, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    """ONNX → onnx2torch (checked against ONNX Runtime on the evaluation set) → ML Program package."""
    from importlib.metadata import version

    assert isinstance(spec.config, cml.CoreMLConfig)
    source = request.torch_model
    module = cml.load_torch_model(source) if source else cml.to_torch(model)
    what = f"the torch model {source.name}" if source else "onnx2torch's module"
    inputs = graph_inputs(model)
    outputs = list(request.reference)
    exact = predict(cml.torch_runner(module, inputs, outputs, cml.CoreMLConfig(precision="fp32")), request.evaluation)
    scale = max([1.0] + [float(np.max(np.abs(v))) for v in request.reference.values() if v.size])
    diff = max(float(np.max(np.abs(exact[k].astype(np.float64) - v))) for k, v in request.reference.items())
    if diff > TORCH_MATCH_TOLERANCE * scale:
        raise ConversionError(f"{what} differs from ONNX Runtime by {diff:.3g} on the evaluation set")
    params: dict[str, str | int | float | bool | list[str] | None] = {
        "torch": version("torch"),
        "max_abs_vs_onnxruntime": diff,
    }
    if source:
        params |= {"file": source.name, "sha256": request.data_sha.get("torch", "")}
    built.passes.append(PassRecord(name="torch-model" if source else "onnx2torch", params=params))
    package = directory / "model.mlpackage"
    cml.export_mlpackage(module, inputs, outputs, request.evaluation.sample(0), spec.config, package)
    cml.check_package(package, inputs, outputs, request.evaluation.sample(0))
    built.passes.append(PassRecord(name="coreml-mlprogram", params=spec.config.params()))
    built.files = cml.package_files(package, COREML_PACKAGE)
    if not spec.run_on.startswith("coreml:"):
        emulated = {"fp32": "FP32", "fp16": "FP16 compute emulated", "int8-weights": "FP16, int8 weights emulated"}
        built.notes.append(
            f"CoreML predicts only on macOS: accuracy from {what} in torch ({emulated[spec.config.precision]})"
        )
