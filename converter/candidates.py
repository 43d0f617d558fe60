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

from edgefleet.converter import large_model, phases
from edgefleet.converter.accuracy import Budget, Score
from edgefleet.converter.cache import cache_key
from edgefleet.converter.candidate_formats import (
    COREML_PACKAGE,
    MODEL_DIR,
    finish_web,
    graph_inputs,
    make_coreml,
    make_tensorrt,
)
from edgefleet.converter.context import Context
from edgefleet.converter.measure import Runner, openvino_runner, ort_runner, predict
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.precision_holdout import Judgement
from edgefleet.converter.precision_nncf import MixedNNCFConfig, quantize_mixed
from edgefleet.converter.prepare import Prepared
from edgefleet.converter.pruning import Pruned, Pruner, TimedRunner
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import PassRecord, TensorRTOptions

log = logging.getLogger(__name__)

Kind = Literal[
    "ort-fp32", "ort-fp16", "ort-int8-dynamic", "ort-int8-static", "ov", "ov-nncf", "ov-nncf-accuracy", "coreml", "trt"
]  # fmt: skip
Config = (
    prec.StaticConfig | prec.DynamicConfig | prec.Fp16Config | ovp.NNCFConfig | cml.CoreMLConfig | trt.TensorRTConfig
    | MixedNNCFConfig | None
)  # fmt: skip


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
    # This host is a proxy for the target: ORT runs the quantized graph as written (Q/DQ around float ops), the
    # arithmetic the target's int8 kernels compute, not this CPU's fused int8 kernels (which saturate without
    # VNNI: a Haswell-class CPU lost 1.1 points of top-1 on the digits CNN that a VNNI CPU or TensorRT keeps).
    as_written: bool = False

    @property
    def needs_calibration(self) -> bool:
        return self.kind in ("ort-int8-static", "ov-nncf", "ov-nncf-accuracy") or (
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
    eval_ms: list[float] = field(default_factory=list)  # per-sample times of the accuracy evaluation
    pruned: bool = False  # stopped during evaluation: it cannot beat a candidate inside the budget
    judged: Judgement | None = None  # mixed precision: the evaluation split that judged it (None: the whole set)

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
        return ort_runner(self.proxy or self.model_file, threads, self.spec.run_on, as_written=self.spec.as_written)


def _config_params(spec: Spec) -> dict[str, str | int | float | bool | list[str] | None]:
    if spec.config is None:
        return {}
    if not isinstance(spec.config, prec.DynamicConfig | prec.Fp16Config):  # the others say what they record
        return spec.config.params()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(spec.config).items()}


def build(
    ctx: Context,
    prepared: Prepared,
    spec: Spec,
    budget: Budget,
    *,
    threads: int | None = None,
    pruner: Pruner | None = None,
) -> Built:
    """Build, evaluate (at `threads`, recording each sample's time) and gate one candidate. With a `pruner`, the
    evaluation stops as soon as the candidate cannot beat one already inside the budget (see converter.pruning)."""
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
            built.notes = list(cached.meta.get("notes", []))
            if cached.meta.get("proxy"):
                built.proxy = cached.file(cached.meta["proxy"])
            if cached.meta.get("tensorrt"):
                built.tensorrt = TensorRTOptions.model_validate(cached.meta["tensorrt"])
        else:
            _check_suited(prepared.model, spec, ctx.source.large)
            with phases.phase("quantize" if spec.kind in QUANTIZING_KINDS or spec.needs_calibration else "export"):
                _make(ctx, prepared.model, spec, built, directory)
        if cached is not None and cached.meta.get("evaluated", True):
            built.outputs, built.cached = cached.outputs, True
        else:  # built now, or a cached build whose evaluation a pruner stopped in an earlier run
            try:
                with phases.phase("accuracy"):
                    timed = TimedRunner(built.runner(threads or ctx.threads, list(ctx.reference)), pruner)
                    try:
                        built.outputs = predict(timed, ctx.evaluation)
                    finally:
                        built.eval_ms = timed.samples_ms
            except Pruned:
                if cached is None:  # keep the build: another run may have other bounds
                    _store(ctx, key, built, {})
                raise
            _store(ctx, key, built, built.outputs, replace=cached is not None)
    except ConversionError as err:
        built.error = str(err)
        built.pruned = isinstance(err, Pruned)
        log.info("candidate %s failed: %s", spec.name, err)
        if not built.pruned:  # another profile's search has other bounds
            ctx.memo[key] = built
        return built
    with phases.phase("accuracy"):
        built.score = ctx.score(built.outputs)
    built.gate = ctx.gate(built.score, budget)
    ctx.memo[key] = built
    return built


def _store(ctx: Context, key: str, built: Built, outputs: dict[str, np.ndarray], *, replace: bool = False) -> None:
    """Into the build cache: the artifacts, and the outputs on the evaluation set once they are known."""
    if not ctx.cache:
        return
    meta = {
        "files": list(built.files),
        "passes": [p.model_dump() for p in built.passes[len(built.prepared.passes) :]],
        "notes": built.notes,
        "proxy": PROXY_NAME if built.proxy else None,
        "tensorrt": built.tensorrt.model_dump() if built.tensorrt else None,
        "evaluated": bool(outputs),
    }
    stored = dict(built.files) | ({PROXY_NAME: built.proxy} if built.proxy else {})
    ctx.cache.put(key, stored, meta, outputs, replace=replace)


PROXY_NAME = "proxy/model.onnx"
QUANTIZING_KINDS = ("ort-int8-dynamic", "ort-int8-static", "ov-nncf", "ov-nncf-accuracy")


def _check_suited(model: onnx.ModelProto, spec: Spec, large: bool = False) -> None:
    """INT8 quantizers run the model in their own sessions, which cannot load custom operators."""
    from edgefleet.converter.passes.custom_ops import custom_ops

    if large:
        why = large_model.refusal(spec.kind, spec.runtime, spec.format)
        if why:
            raise ConversionError(why)
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
        make_coreml(ctx, model, spec, built, directory)
        return
    if spec.kind == "trt":
        make_tensorrt(ctx, model, spec, built, directory)
        return
    if spec.kind in ("ov", "ov-nncf", "ov-nncf-accuracy"):
        if ctx.source.large:
            config = ovp.OpenVINOConfig(spec.hint, spec.compress_to_fp16)  # type: ignore[arg-type]
            artifact = large_model.openvino(ctx.source.path, config)
        else:
            artifact = _openvino_model(ctx, model, spec)
        if isinstance(spec.config, MixedNNCFConfig):
            artifact, record, note = quantize_mixed(ctx, artifact, spec.config, built.prepared.sha)
            built.passes.append(record)
            built.notes.append(note)
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
    if ctx.source.large:  # converter/large_model.py: the file and its external data as exported
        built.files = large_model.stage(ctx.source.path, model, directory)
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
        finish_web(out, spec, built, directory)
        return
    path = directory / "model.onnx"
    onnx.save(out, str(path))
    built.files = {f"{MODEL_DIR}/model.onnx": path}


def _openvino_model(ctx: Context, model: onnx.ModelProto, spec: Spec) -> ovp.OpenVINOArtifact:
    """The prepared graph converted to OpenVINO once per conversion; each candidate gets its own clone."""
    key = f"openvino-model:{id(model)}"
    held = ctx.memo.get(key)
    if held is None or held[0] is not model:
        with phases.phase("export"):
            held = (model, ovp.export_openvino(model, ovp.OpenVINOConfig(None)))
        ctx.memo[key] = held
    converted: ovp.OpenVINOArtifact = held[1]
    return ovp.OpenVINOArtifact(converted.model.clone(), spec.hint, spec.compress_to_fp16)
