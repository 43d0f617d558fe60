"""Building one candidate recipe on a prepared model: precision pass, export, outputs, accuracy — cached.

Every built artifact is written under the conversion's work directory and read back from those files for
evaluation, so what is measured is exactly what would ship. Two formats cannot run here as shipped, and use the
proxy their module documents: TensorRT bundles (an engine is built on the device: the host runs an FP16 / INT8
QDQ graph of the same recipe) and CoreML packages off macOS (the onnx2torch module coremltools converted, in
torch with the recipe emulated).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from edgefleet.converter.accuracy import Budget, Score
from edgefleet.converter.cache import cache_key
from edgefleet.converter.context import Context
from edgefleet.converter.measure import Runner, openvino_runner, ort_runner, predict
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.passes import web
from edgefleet.converter.prepare import Prepared
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import PassRecord, TensorRTOptions, TensorSpec

log = logging.getLogger(__name__)

Kind = Literal["ort-fp32", "ort-fp16", "ort-int8-dynamic", "ort-int8-static", "ov", "ov-nncf", "coreml", "trt"]
Config = (
    prec.StaticConfig | prec.DynamicConfig | prec.Fp16Config | ovp.NNCFConfig | cml.CoreMLConfig | trt.TensorRTConfig
    | None
)  # fmt: skip
MODEL_DIR = "model"
COREML_PACKAGE = f"{MODEL_DIR}/model.mlpackage"
TORCH_MATCH_TOLERANCE = 1e-3  # onnx2torch's module vs ONNX Runtime, relative to the largest output magnitude


@dataclass(frozen=True)
class Spec:
    name: str
    kind: Kind
    precision: str
    runtime: str
    format: str
    run_on: str  # ORT provider or OpenVINO device used on this host
    config: Config = None
    hint: str | None = None  # OpenVINO inference precision hint recorded for the device
    compress_to_fp16: bool = False
    ort_format: bool = False  # onnxruntime-web: ship ONNX Runtime's ORT format

    @property
    def needs_calibration(self) -> bool:
        return self.kind in ("ort-int8-static", "ov-nncf") or (
            isinstance(self.config, trt.TensorRTConfig) and self.config.precision == "int8-static"
        )


@dataclass
class Built:
    spec: Spec
    prepared: Prepared
    files: dict[str, Path] = field(default_factory=dict)  # bundle-relative name → staged file
    passes: list[PassRecord] = field(default_factory=list)
    outputs: dict[str, np.ndarray] | None = None
    score: Score | None = None
    gate: str | None = None
    error: str | None = None
    cached: bool = False
    qdq_model: onnx.ModelProto | None = None  # kept for the per-layer report
    proxy: Path | None = None  # the ONNX graph this host runs in place of the artifact (TensorRT)
    tensorrt: TensorRTOptions | None = None  # what the bundle tells the device's TensorRT EP
    notes: list[str] = field(default_factory=list)
    torch_model: Path | None = None  # CoreML: the user's torch model (else onnx2torch's module of the graph)

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())

    @property
    def model_rel(self) -> str:
        """The artifact the runtime loads, as a bundle path (an .mlpackage is a directory)."""
        if self.spec.kind == "coreml":
            return COREML_PACKAGE
        return next(n for n in self.files if n.endswith((".onnx", ".xml", ".ort")) and n.startswith(MODEL_DIR))

    @property
    def model_file(self) -> Path:
        if self.spec.kind == "coreml":
            anchor = self.files[f"{COREML_PACKAGE}/Manifest.json"]
            return anchor.parent
        return self.files[self.model_rel]

    def runner(self, threads: int, output_names: list[str]) -> Runner:
        if self.spec.format == "openvino-ir":
            import openvino as ov

            artifact = ovp.OpenVINOArtifact(
                ov.Core().read_model(str(self.model_file)), self.spec.hint, self.spec.compress_to_fp16
            )
            return openvino_runner(artifact, output_names, threads, self.spec.run_on)
        if self.spec.kind == "coreml":
            assert isinstance(self.spec.config, cml.CoreMLConfig) and self.prepared.model is not None
            if self.spec.run_on.startswith("coreml:"):
                return cml.coreml_runner(self.model_file, output_names, self.spec.run_on.removeprefix("coreml:"))
            module = cml.load_torch_model(self.torch_model) if self.torch_model else cml.to_torch(self.prepared.model)
            return cml.torch_runner(module, graph_inputs(self.prepared.model), output_names, self.spec.config)
        return ort_runner(self.proxy or self.model_file, threads, self.spec.run_on)


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    from edgefleet.converter.model import tensor_spec

    initializers = {init.name for init in model.graph.initializer}
    return [tensor_spec(v) for v in model.graph.input if v.name not in initializers]


def _config_params(spec: Spec) -> dict[str, str | int | float | bool | list[str] | None]:
    if spec.config is None:
        return {}
    if isinstance(spec.config, prec.StaticConfig | ovp.NNCFConfig | cml.CoreMLConfig | trt.TensorRTConfig):
        return spec.config.params()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(spec.config).items()}


def build(ctx: Context, prepared: Prepared, spec: Spec, budget: Budget) -> Built:
    assert prepared.model is not None
    parts = {
        "prepared": prepared.sha,
        "spec": repr(spec),
        "eval": ctx.data_sha["eval"],
        "calib": ctx.data_sha["calib"] if spec.needs_calibration else "",
        "torch": ctx.data_sha.get("torch", "") if spec.kind == "coreml" else "",
    }
    key = cache_key(parts)
    if key in ctx.memo:
        memo: Built = ctx.memo[key]
        return memo
    built = Built(spec, prepared, passes=list(prepared.passes))
    built.torch_model = ctx.torch_model if spec.kind == "coreml" else None
    directory = ctx.work / "candidates" / key[:16]
    directory.mkdir(parents=True, exist_ok=True)
    cached = ctx.cache.get(key) if ctx.cache else None
    try:
        if cached is not None:
            built.files = {name: cached.file(name) for name in cached.meta["files"]}
            built.passes += [PassRecord.model_validate(p) for p in cached.meta["passes"]]
            built.outputs, built.cached = cached.outputs, True
            built.notes = list(cached.meta.get("notes", []))
            if cached.meta.get("proxy"):
                built.proxy = cached.file(cached.meta["proxy"])
            if cached.meta.get("tensorrt"):
                built.tensorrt = TensorRTOptions.model_validate(cached.meta["tensorrt"])
        else:
            _check_suited(prepared.model, spec)
            _make(ctx, prepared.model, spec, built, directory)
            built.outputs = predict(built.runner(ctx.threads, list(ctx.reference)), ctx.evaluation)
            if ctx.cache:
                meta = {
                    "files": list(built.files),
                    "passes": [p.model_dump() for p in built.passes[len(prepared.passes) :]],
                    "notes": built.notes,
                    "proxy": PROXY_NAME if built.proxy else None,
                    "tensorrt": built.tensorrt.model_dump() if built.tensorrt else None,
                }
                stored = dict(built.files) | ({PROXY_NAME: built.proxy} if built.proxy else {})
                ctx.cache.put(key, stored, meta, built.outputs)
    except ConversionError as err:
        built.error = str(err)
        log.info("candidate %s failed: %s", spec.name, err)
        ctx.memo[key] = built
        return built
    built.score = ctx.score(built.outputs)
    built.gate = ctx.gate(built.score, budget)
    ctx.memo[key] = built
    return built


PROXY_NAME = "proxy/model.onnx"
QUANTIZING_KINDS = ("ort-int8-dynamic", "ort-int8-static", "ov-nncf")


def _check_suited(model: onnx.ModelProto, spec: Spec) -> None:
    """INT8 quantizers run the model in their own sessions, which cannot load custom operators."""
    from edgefleet.converter.passes.custom_ops import custom_ops

    if spec.kind in QUANTIZING_KINDS or (spec.kind == "trt" and spec.needs_calibration):
        kept = [op.key for op in custom_ops(model)]
        if kept:
            raise ConversionError(
                f"not suited: INT8 calibration runs the model in onnxruntime's quantizer, which cannot load the "
                f"custom operators {', '.join(kept)} (decompose them to quantize)"
            )


def _make(ctx: Context, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    params = _config_params(spec)
    if spec.kind == "coreml":
        _make_coreml(ctx, model, spec, built, directory)
        return
    if spec.kind == "trt":
        _make_tensorrt(ctx, model, spec, built, directory)
        return
    if spec.kind in ("ov", "ov-nncf"):
        artifact = ovp.export_openvino(model, ovp.OpenVINOConfig(spec.hint, spec.compress_to_fp16))  # type: ignore[arg-type]
        if spec.kind == "ov-nncf":
            assert isinstance(spec.config, ovp.NNCFConfig)
            artifact = ovp.quantize_nncf(artifact, spec.config, ctx.calib)
            built.passes.append(PassRecord(name="nncf-int8", params=params))
        built.passes.append(
            PassRecord(
                name="openvino-ir",
                params={
                    "inference_precision_hint": spec.hint,
                    "compress_to_fp16": spec.compress_to_fp16,
                    "performance_hint": "LATENCY",
                },
            )
        )
        xml = directory / "model.xml"
        artifact.save(xml)
        built.files = {"model/model.xml": xml, "model/model.bin": xml.with_suffix(".bin")}
        return
    if spec.kind == "ort-fp32":
        out = model
    elif spec.kind == "ort-fp16":
        assert isinstance(spec.config, prec.Fp16Config)
        out = prec.to_fp16(model, spec.config)
        built.passes.append(PassRecord(name="fp16", params=params))
    elif spec.kind == "ort-int8-dynamic":
        assert isinstance(spec.config, prec.DynamicConfig)
        reason = prec.dynamic_unsuitability(model, spec.config)
        if reason:
            raise ConversionError(reason)
        out = prec.quantize_int8_dynamic(model, spec.config)
        built.passes.append(PassRecord(name="int8-dynamic", params=params))
    else:
        assert isinstance(spec.config, prec.StaticConfig)
        out = prec.quantize_int8_static(model, spec.config, ctx.calib)
        built.qdq_model = out
        built.passes.append(PassRecord(name="int8-static-qdq", params=params | {"calibration_samples": len(ctx.calib)}))
    if spec.runtime == "onnxruntime-web":
        _finish_web(out, spec, built, directory)
        return
    path = directory / "model.onnx"
    onnx.save(out, str(path))
    built.files = {f"{MODEL_DIR}/model.onnx": path}


def _finish_web(model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
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


def _make_tensorrt(ctx: Context, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    """The FP32 graph as shipped, the EP options, the INT8 calibration table, and the CPU proxy."""
    assert isinstance(spec.config, trt.TensorRTConfig)
    config = spec.config
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    built.files = {f"{MODEL_DIR}/model.onnx": path}
    table_rel = None
    if config.precision == "int8-static":
        table = trt.write_calibration_table(model, ctx.calib, directory / "calibration", config.max_samples)
        table_rel = f"{MODEL_DIR}/{trt.CALIBRATION_TABLE}"
        built.files[table_rel] = table
        built.passes.append(
            PassRecord(
                name="tensorrt-calibration-table",
                params={"method": "minmax", "symmetric": True, "samples": min(len(ctx.calib), config.max_samples)},
            )
        )
    built.tensorrt = config.options(table_rel)
    built.passes.append(PassRecord(name="tensorrt-ep-options", params=config.params()))
    lacking = trt.unsupported_ops(model)
    if lacking:
        built.notes.append(
            f"TensorRT's ONNX parser cannot take {', '.join(lacking)}: those nodes run on the CUDA/CPU EPs"
        )
    proxy = trt.proxy_model(model, config, ctx.calib)
    if proxy is not model:
        built.proxy = directory / "proxy.onnx"
        onnx.save(proxy, str(built.proxy))


def _make_coreml(ctx: Context, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    """ONNX → onnx2torch (checked against ONNX Runtime on the evaluation set) → ML Program package."""
    from importlib.metadata import version

    assert isinstance(spec.config, cml.CoreMLConfig)
    source = ctx.torch_model
    module = cml.load_torch_model(source) if source else cml.to_torch(model)
    what = f"the torch model {source.name}" if source else "onnx2torch's module"
    inputs = graph_inputs(model)
    outputs = list(ctx.reference)
    exact = predict(cml.torch_runner(module, inputs, outputs, cml.CoreMLConfig(precision="fp32")), ctx.evaluation)
    scale = max([1.0] + [float(np.max(np.abs(v))) for v in ctx.reference.values() if v.size])
    diff = max(float(np.max(np.abs(exact[k].astype(np.float64) - v))) for k, v in ctx.reference.items())
    if diff > TORCH_MATCH_TOLERANCE * scale:
        raise ConversionError(f"{what} differs from ONNX Runtime by {diff:.3g} on the evaluation set")
    params: dict[str, str | int | float | bool | list[str] | None] = {
        "torch": version("torch"),
        "max_abs_vs_onnxruntime": diff,
    }
    if source:
        params |= {"file": source.name, "sha256": ctx.data_sha.get("torch", "")}
    built.passes.append(PassRecord(name="torch-model" if source else "onnx2torch", params=params))
    package = directory / "model.mlpackage"
    cml.export_mlpackage(module, inputs, outputs, ctx.evaluation.sample(0), spec.config, package)
    cml.check_package(package, inputs, outputs, ctx.evaluation.sample(0))
    built.passes.append(PassRecord(name="coreml-mlprogram", params=spec.config.params()))
    built.files = cml.package_files(package, COREML_PACKAGE)
    if not spec.run_on.startswith("coreml:"):
        emulated = {"fp32": "FP32", "fp16": "FP16 compute emulated", "int8-weights": "FP16, int8 weights emulated"}
        built.notes.append(
            f"CoreML predicts only on macOS: accuracy from {what} in torch ({emulated[spec.config.precision]})"
        )
