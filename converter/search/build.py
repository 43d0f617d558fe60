"""The build stage: one recipe on a prepared graph: precision pass, export, outputs on the evaluation set, score
and gate (converter.search.gate), cached by content (converter.search.cache) and memoized for the conversion."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnx

from edgefleet.converter import deadline, large_model, phases
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.custom_ops import custom_ops
from edgefleet.converter.passes.nncf_accuracy import MixedNNCFConfig, quantize_to_bar
from edgefleet.converter.runners import predict
from edgefleet.converter.search.cache import cache_key
from edgefleet.converter.search.formats import finish_web, make_coreml, make_tensorrt
from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.golden_gate import golden_figures
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.search.types import MODEL_DIR, Built, Prepared, Spec
from edgefleet.converter.timing.pruning import Pruned, Pruner, TimedRunner
from edgefleet.core.bundle.manifest import PassRecord, TensorRTOptions
from edgefleet.core.custom_ops.packages import ort_native_ops
from edgefleet.core.errors import ConversionError

__all__ = ["PROXY_NAME", "build"]

log = logging.getLogger(__name__)


def _config_params(spec: Spec) -> dict[str, str | int | float | bool | list[str] | None]:
    if spec.config is None:
        return {}
    if not isinstance(spec.config, prec.DynamicConfig | prec.Fp16Config):  # the others say what they record
        return spec.config.params()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(spec.config).items()}


def build(
    request: SearchRequest,
    ws: Workspace,
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
        "eval": request.data_sha["eval"],
        "calib": request.data_sha["calib"] if spec.needs_calibration else "",
        "torch": request.data_sha.get("torch", "") if spec.kind == "coreml" else "",
    }
    key = cache_key(parts)
    if key in ws.memo.builds:
        return ws.memo.builds[key]
    built = Built(spec, prepared, passes=list(prepared.passes))
    built.torch_model = request.torch_model if spec.kind == "coreml" else None
    directory = ws.work / "candidates" / key[:16]
    directory.mkdir(parents=True, exist_ok=True)
    cached = ws.cache.get(key) if ws.cache else None
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
            _check_suited(prepared.model, spec, request.source.large)
            with phases.phase("quantize" if spec.kind in QUANTIZING_KINDS or spec.needs_calibration else "export"):
                _make(request, ws, prepared.model, spec, built, directory)
        if cached is not None and cached.meta.get("evaluated", True):
            built.outputs, built.cached = cached.outputs, True
        else:  # built now, or a cached build whose evaluation a pruner stopped in an earlier run
            try:
                with phases.phase("accuracy"):
                    timed = TimedRunner(built.runner(threads or request.threads, request.output_names), pruner)
                    try:
                        built.outputs = predict(timed, request.evaluation)
                    finally:
                        built.eval_ms = timed.samples_ms
            except Pruned:
                if cached is None:  # keep the build: another run may have other bounds
                    _store(ws, key, built, {})
                raise
            _store(ws, key, built, built.outputs, replace=cached is not None)
    except ConversionError as err:
        built.error = str(err)
        built.pruned = isinstance(err, Pruned)
        log.info("candidate %s failed: %s", spec.name, err)
        if not built.pruned and not isinstance(err, deadline.TimeBudgetSpent):  # another profile has other bounds
            ws.memo.builds[key] = built
        return built
    with phases.phase("accuracy"):
        built.score = request.score(built.outputs)
    built.gate = request.gate(built.score, budget)
    built.golden_refusal = golden_figures(request, built, budget)[1] or None
    built.gate = built.gate or built.golden_refusal  # a refused candidate gets its retries, as one below the bar
    ws.memo.builds[key] = built
    return built


def _store(ws: Workspace, key: str, built: Built, outputs: dict[str, np.ndarray], *, replace: bool = False) -> None:
    """Into the build cache: the artifacts, and the outputs on the evaluation set once they are known."""
    if not ws.cache:
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
    ws.cache.put(key, stored, meta, outputs, replace=replace)


PROXY_NAME = "proxy/model.onnx"
QUANTIZING_KINDS = (
    "ort-int8-dynamic",
    "ort-int8-static",
    "ort-int8-weights",
    "ov-nncf",
    "ov-nncf-accuracy",
    "ov-compress",
)


def _check_suited(model: onnx.ModelProto, spec: Spec, large: bool = False) -> None:
    """INT8 quantizers run the model in their own sessions, which cannot load custom operators."""
    if large:
        why = large_model.refusal(spec.kind, spec.runtime, spec.format)
        if why:
            raise ConversionError(why)
    if spec.kind in QUANTIZING_KINDS or (spec.kind == "trt" and spec.needs_calibration):
        native = ort_native_ops()  # ONNX Runtime's own contrib operators load in the quantizers' sessions too
        kept = [op.key for op in custom_ops(model) if (op.domain, op.op_type) not in native]
        if kept:
            raise ConversionError(
                f"not suited: INT8 calibration runs the model in onnxruntime's quantizer, which cannot load the "
                f"custom operators {', '.join(kept)} (decompose them to quantize)"
            )


def _make(
    request: SearchRequest, ws: Workspace, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path
) -> None:
    params = _config_params(spec)
    if spec.kind == "coreml":
        make_coreml(request, model, spec, built, directory)
        return
    if spec.kind == "trt":
        make_tensorrt(request, model, spec, built, directory)
        return
    if spec.kind in ("ov", "ov-nncf", "ov-nncf-accuracy", "ov-compress"):
        if request.source.large:
            config = ovp.OpenVINOConfig(spec.hint, spec.compress_to_fp16)  # type: ignore[arg-type]
            artifact = large_model.openvino(request.source.path, config)
        else:
            artifact = _openvino_model(ws, model, spec)
        if isinstance(spec.config, MixedNNCFConfig):
            artifact, record, note = _quantize_mixed(request, ws, artifact, spec.config, built.prepared.sha)
            built.passes.append(record)
            built.notes.append(note)
        if spec.kind == "ov-nncf":
            assert isinstance(spec.config, ovp.NNCFConfig)
            artifact = ovp.quantize_nncf(artifact, spec.config, request.calib)
            built.passes.append(PassRecord(name="nncf-int8", params=params))
        if spec.kind == "ov-compress":
            assert isinstance(spec.config, ovp.CompressConfig)
            artifact = ovp.compress_weights(artifact, spec.config)
            built.passes.append(PassRecord(name="nncf-compress-weights", params=params))
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
    if request.source.large:  # converter/large_model.py: the file and its external data as exported
        built.files = large_model.stage(request.source.path, model, directory)
        return
    if spec.kind == "ort-fp32":
        out = model
    elif spec.kind == "ort-fp16":
        assert isinstance(spec.config, prec.Fp16Config)
        out = prec.to_fp16(model, spec.config)
        built.passes.append(PassRecord(name="fp16", params=params))
    elif spec.kind == "ort-int8-weights":
        assert isinstance(spec.config, prec.WeightOnlyConfig)
        out = prec.quantize_weights(model, spec.config)
        built.passes.append(PassRecord(name="weight-only-matmulnbits", params=params))
    elif spec.kind == "ort-int8-dynamic":
        assert isinstance(spec.config, prec.DynamicConfig)
        reason = prec.dynamic_unsuitability(model, spec.config)
        if reason:
            raise ConversionError(reason)
        out = prec.quantize_int8_dynamic(model, spec.config)
        built.passes.append(PassRecord(name="int8-dynamic", params=params))
    else:
        assert isinstance(spec.config, prec.StaticConfig)
        out = prec.quantize_int8_static(model, spec.config, request.calib, ws.statistics)
        built.qdq_model = out
        built.passes.append(
            PassRecord(name="int8-static-qdq", params=params | {"calibration_samples": len(request.calib)})
        )
    if spec.runtime == "onnxruntime-web":
        finish_web(out, spec, built, directory)
        return
    path = directory / "model.onnx"
    onnx.save(out, str(path))
    built.files = {f"{MODEL_DIR}/model.onnx": path}


def _openvino_model(ws: Workspace, model: onnx.ModelProto, spec: Spec) -> ovp.OpenVINOArtifact:
    """The prepared graph converted to OpenVINO once per conversion; each candidate gets its own clone."""
    held = ws.memo.openvino.get(id(model))
    if held is None or held[0] is not model:
        with phases.phase("export"):
            held = (model, ovp.export_openvino(model, ovp.OpenVINOConfig(None)))
        ws.memo.openvino[id(model)] = held
    converted = held[1]
    return ovp.OpenVINOArtifact(converted.model.clone(), spec.hint, spec.compress_to_fp16)


def _quantize_mixed(
    request: SearchRequest, ws: Workspace, artifact: ovp.OpenVINOArtifact, config: MixedNNCFConfig, source_key: str
) -> tuple[ovp.OpenVINOArtifact, PassRecord, str]:
    """The accuracy-controlled INT8 model (converter.passes.nncf_accuracy.quantize_to_bar), the pass record naming
    its float layers, and a note for the report.

    Done once per source graph (`source_key`: the prepared model's hash) and config: the variants that differ only
    in the inference precision hint share it. NNCF validates on the selection part of the evaluation set only."""
    key = f"{source_key}:{config!r}"
    if key not in ws.memo.nncf_mixed:
        selection = request.part("selection")
        ws.memo.nncf_mixed[key] = quantize_to_bar(
            artifact, config, request.calib, selection.evaluation, selection.reference, request.plan.metric
        )
    model, record, note = ws.memo.nncf_mixed[key]
    # A clone each: the variants set their own precision hint on the model they are saved from.
    return ovp.OpenVINOArtifact(model.model.clone(), artifact.inference_precision_hint, False), record, note
