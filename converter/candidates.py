"""Building one candidate recipe on a prepared model: precision pass, export, outputs, accuracy — cached.

Every built artifact is written under the conversion's work directory and read back from those files for
evaluation, so what is measured is exactly what would ship.
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
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.prepare import Prepared
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import PassRecord

log = logging.getLogger(__name__)

Kind = Literal["ort-fp32", "ort-fp16", "ort-int8-dynamic", "ort-int8-static", "ov", "ov-nncf"]
Config = prec.StaticConfig | prec.DynamicConfig | prec.Fp16Config | ovp.NNCFConfig | None


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

    @property
    def needs_calibration(self) -> bool:
        return self.kind in ("ort-int8-static", "ov-nncf")


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

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())

    @property
    def model_file(self) -> Path:
        return next(p for n, p in self.files.items() if n.endswith((".onnx", ".xml")))

    def runner(self, threads: int, output_names: list[str]) -> Runner:
        if self.spec.format == "openvino-ir":
            import openvino as ov

            artifact = ovp.OpenVINOArtifact(
                ov.Core().read_model(str(self.model_file)), self.spec.hint, self.spec.compress_to_fp16
            )
            return openvino_runner(artifact, output_names, threads, self.spec.run_on)
        return ort_runner(self.model_file, threads, self.spec.run_on)


def _config_params(spec: Spec) -> dict[str, str | int | float | bool | list[str] | None]:
    if spec.config is None:
        return {}
    if isinstance(spec.config, prec.StaticConfig | ovp.NNCFConfig):
        return spec.config.params()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(spec.config).items()}


def build(ctx: Context, prepared: Prepared, spec: Spec, budget: Budget) -> Built:
    assert prepared.model is not None
    parts = {
        "prepared": prepared.sha,
        "spec": repr(spec),
        "eval": ctx.data_sha["eval"],
        "calib": ctx.data_sha["calib"] if spec.needs_calibration else "",
    }
    key = cache_key(parts)
    if key in ctx.memo:
        memo: Built = ctx.memo[key]
        return memo
    built = Built(spec, prepared, passes=list(prepared.passes))
    directory = ctx.work / "candidates" / key[:16]
    directory.mkdir(parents=True, exist_ok=True)
    cached = ctx.cache.get(key) if ctx.cache else None
    try:
        if cached is not None:
            built.files = {name: cached.file(Path(name).name) for name in cached.meta["files"]}
            built.passes += [PassRecord.model_validate(p) for p in cached.meta["passes"]]
            built.outputs, built.cached = cached.outputs, True
        else:
            _make(ctx, prepared.model, spec, built, directory)
            built.outputs = predict(built.runner(ctx.threads, list(ctx.reference)), ctx.evaluation)
            if ctx.cache:
                meta = {
                    "files": list(built.files),
                    "passes": [p.model_dump() for p in built.passes[len(prepared.passes) :]],
                }
                ctx.cache.put(key, {Path(n).name: p for n, p in built.files.items()}, meta, built.outputs)
    except ConversionError as err:
        built.error = str(err)
        log.info("candidate %s failed: %s", spec.name, err)
        ctx.memo[key] = built
        return built
    built.score = ctx.score(built.outputs)
    built.gate = ctx.gate(built.score, budget)
    ctx.memo[key] = built
    return built


def _make(ctx: Context, model: onnx.ModelProto, spec: Spec, built: Built, directory: Path) -> None:
    params = _config_params(spec)
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
    path = directory / "model.onnx"
    onnx.save(out, str(path))
    built.files = {"model/model.onnx": path}
