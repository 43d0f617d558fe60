"""The candidates of one generative target, declared: each precision the profile lists → how it is built (a
`BuildRecipe`: the anchor's builder or a post-pass and its parameters), the runtime properties it is judged and
timed with, and what it needs. A pure function of (target, source, what this host has); nothing is imported or
built here.

| runtime | precision | candidates |
|---|---|---|
| onnxruntime-genai | fp32 | ORT GenAI model builder `-p fp32` (an ONNX source: kept as it is) |
| | fp16 | builder `-p fp16` on CUDA; never on the CPU (0.18's FP16 CPU model fails at its first decode step) |
| | int8-weights | builder `-p int8` (MatMulNBits, 8 bits) |
| | int4-weights | builder `-p int4` RTN, block 32; GPTQ (data-aware) on the FP32 model, block 32 |
| openvino-genai | fp32 | the stateful IR from the Hugging Face weights; f32 hint and KV cache, no dynamic quant. |
| | bf16 | the same IR with the CPU's bf16 hint (where this CPU computes bf16) |
| | fp16 | the IR with FP16 weights and the f16 hint (GPU, NPU) |
| | int8-weights | NNCF `compress_weights` INT8_ASYM, per channel |
| | int4-weights | NNCF INT4_SYM group 32, ratio 1.0; the same with AWQ + scale estimation on the calibration text |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.converter.generative.source import DecoderSource
from edgefleet.core.profiles import GenerativeTarget

__all__ = [
    "GROUP_SIZE",
    "BuildRecipe",
    "CandidateSpec",
    "HostView",
    "Skipped",
    "TargetPlan",
    "plan_target",
]

GROUP_SIZE = 32  # INT4 block / group: the GenAI builder's CPU default; finer than NNCF's usual 128 for small dims
# OpenVINO CPU properties. Its defaults on an AVX512_BF16 CPU are bf16 compute, a u8 KV cache and int8 dynamic
# activation quantization (group 32) for compressed weights: FP32 pins all three; the others keep the fast cache
# and activations with f32 compute, and say so in the bundle (GenerationSpec.runtime_config).
OV_EXACT: dict[str, str | int] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
}
OV_COMPRESSED: dict[str, str | int] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "u8",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32,
}
OV_BF16: dict[str, str | int] = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "u8"}

Method = Literal["ort-builder", "ort-as-is", "ort-nbits", "ort-gptq", "ov-export", "ov-nncf"]
Param = str | int | float | bool


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BuildRecipe(_Frozen):
    """How one artifact (a folder the runtime loads) is made. Several candidates may share one (OpenVINO's FP32 IR
    is judged with the f32 and the bf16 hint)."""

    key: str = Field(description="the artifact's name, unique within a conversion")
    method: Method
    params: dict[str, Param] = Field(default_factory=dict)
    base: BuildRecipe | None = Field(default=None, description="the artifact a post-pass starts from")
    needs: tuple[str, ...] = Field(default=(), description="'hf': the Hugging Face weights; 'calibration': text")


class CandidateSpec(_Frozen):
    name: str = Field(description="unique within a conversion: the same name is the same artifact and settings")
    runtime: Literal["onnxruntime-genai", "openvino-genai"]
    provider: str = Field(description="the provider it runs on, e.g. onnxruntime-genai:cpu")
    precision: Literal["fp32", "fp16", "bf16", "int8-weights", "int4-weights"]
    build: BuildRecipe
    runtime_config: dict[str, str | int] = Field(default_factory=dict)
    description: str
    order: int = Field(description="place in the profile's preference order (targets, then precisions)")
    measurable: bool = Field(description="timed on this host (its device is here and the host is the profile's)")

    @property
    def device(self) -> str:
        return self.provider.split(":", 1)[1]


@dataclass(frozen=True)
class Skipped:
    name: str  # the precision (or candidate) not built
    reason: str


@dataclass(frozen=True)
class TargetPlan:
    candidates: list[CandidateSpec]
    skipped: list[Skipped]
    notes: list[str]


@dataclass(frozen=True)
class HostView:
    """What this host offers the plan: the generative providers it can time, whether it is the profile's hardware
    (and why not), and whether its CPU computes bf16."""

    providers: frozenset[str]
    is_profile_hardware: bool = True
    not_profile_reason: str = ""
    cpu_bf16: bool = False


def plan_target(target: GenerativeTarget, source: DecoderSource, host: HostView, order_from: int = 0) -> TargetPlan:
    """Every candidate of `target` in its precision order, and a reason for each precision that has none."""
    provider = target.providers[0]
    here = [p for p in target.providers if p in host.providers]
    if here and host.is_profile_hardware:
        provider, measurable, notes = here[0], True, []
    else:
        measurable = False
        why = host.not_profile_reason if here else f"{'/'.join(target.providers)} is not on this host"
        notes = [f"{target.runtime}: {why}: built and judged here, not timed; chosen by the profile's order"]
    device = provider.split(":", 1)[1]
    candidates: list[CandidateSpec] = []
    skipped: list[Skipped] = []
    openvino_refusal = source.openvino_refusal if target.runtime == "openvino-genai" else None
    for index, precision in enumerate(target.precisions):
        if openvino_refusal:
            skipped.append(Skipped(f"{target.runtime} {precision}", openvino_refusal))
            continue
        make = _ort if target.runtime == "onnxruntime-genai" else _openvino
        made, reason = make(precision, device, source, host)
        if reason:
            skipped.append(Skipped(f"{target.runtime} {precision}", reason))
        for name, recipe, config, description in made:
            candidates.append(
                CandidateSpec(
                    name=name, runtime=target.runtime, provider=provider, precision=precision, build=recipe,
                    runtime_config=config, description=description, order=order_from + index, measurable=measurable,
                )
            )  # fmt: skip
    return TargetPlan(candidates, skipped, notes)


_Made = list[tuple[str, BuildRecipe, dict[str, str | int], str]]


def _ort(precision: str, device: str, source: DecoderSource, host: HostView) -> tuple[_Made, str | None]:
    prefix = "ort" if device == "cpu" else f"ort-{device}"
    if source.kind == "onnx-genai":
        return _ort_from_onnx(precision, prefix, source)
    builder = {"execution_provider": device}
    fp32 = BuildRecipe(key=f"{prefix}-fp32", method="ort-builder", params={**builder, "precision": "fp32"},
                       needs=("hf",))  # fmt: skip
    if precision == "fp32":
        return [(fp32.key, fp32, {}, "FP32: ONNX Runtime GenAI model builder")], None
    if precision == "fp16":
        if device == "cpu":
            return [], (
                "FP16 on ONNX Runtime GenAI's CPU provider is not offered: the builder's FP16 CPU model fails at its "
                "first decode step (0.18, a buffer-reuse error), and the CPU would compute it in FP32 anyway"
            )
        recipe = BuildRecipe(key=f"{prefix}-fp16", method="ort-builder", params={**builder, "precision": "fp16"},
                             needs=("hf",))  # fmt: skip
        return [(recipe.key, recipe, {}, "FP16: ONNX Runtime GenAI model builder")], None
    if precision == "int8-weights":
        recipe = BuildRecipe(key=f"{prefix}-int8", method="ort-builder", params={**builder, "precision": "int8"},
                             needs=("hf",))  # fmt: skip
        return [(recipe.key, recipe, {}, "INT8 weight-only (MatMulNBits 8 bits; the embedding stays FP32)")], None
    if precision == "int4-weights":
        rtn = BuildRecipe(
            key=f"{prefix}-int4-rtn", method="ort-builder", needs=("hf",),
            params={**builder, "precision": "int4", "algo_config": "rtn", "block_size": GROUP_SIZE},
        )  # fmt: skip
        about = f"INT4 weight-only, round to nearest, block {GROUP_SIZE} (MatMulNBits, builder)"
        made: _Made = [(rtn.key, rtn, {}, about)]
        if device == "cpu":  # the quantizer rejects the builder's CUDA graph (its KV outputs share buffers)
            gptq = BuildRecipe(
                key=f"{prefix}-int4-gptq", method="ort-gptq", base=fp32, needs=("hf", "calibration"),
                params={"bits": 4, "block_size": GROUP_SIZE, "algorithm": "gptq"},
            )  # fmt: skip
            made.append((gptq.key, gptq, {}, f"INT4 weight-only, GPTQ on the calibration text, block {GROUP_SIZE}"))
        return made, None
    return [], f"{precision} is not an ONNX Runtime GenAI precision"


def _ort_from_onnx(precision: str, prefix: str, source: DecoderSource) -> tuple[_Made, str | None]:
    """An exported GenAI model: kept as it arrived; a float one is also quantized by ONNX Runtime's MatMulNBits
    quantizer (the builder needs the Hugging Face weights). The artifacts are the same for every device."""
    as_is = BuildRecipe(key="ort-as-is", method="ort-as-is", params={"arrived": source.arrived_precision})
    if precision == source.arrived_precision:
        return [(f"{prefix}-as-is", as_is, {}, f"the model as exported ({precision})")], None
    if source.arrived_precision != "fp32":
        return [], f"the model arrives {source.arrived_precision}: it is not quantized again, nor made {precision}"
    if precision == "int8-weights":
        recipe = BuildRecipe(key="ort-int8", method="ort-nbits", base=as_is,
                             params={"bits": 8, "block_size": GROUP_SIZE, "algorithm": "rtn"})  # fmt: skip
        return [(f"{prefix}-int8", recipe, {}, "INT8 weight-only (MatMulNBits 8 bits, round to nearest)")], None
    if precision == "int4-weights":
        rtn = BuildRecipe(key="ort-int4-rtn", method="ort-nbits", base=as_is,
                          params={"bits": 4, "block_size": GROUP_SIZE, "algorithm": "rtn"})  # fmt: skip
        gptq = BuildRecipe(key="ort-int4-gptq", method="ort-gptq", base=as_is, needs=("calibration",),
                           params={"bits": 4, "block_size": GROUP_SIZE, "algorithm": "gptq"})  # fmt: skip
        return [
            (f"{prefix}-int4-rtn", rtn, {}, f"INT4 weight-only, round to nearest, block {GROUP_SIZE} (MatMulNBits)"),
            (f"{prefix}-int4-gptq", gptq, {},
             f"INT4 weight-only, GPTQ on the calibration text, block {GROUP_SIZE} (MatMulNBits)"),
        ], None  # fmt: skip
    return [], f"{precision} needs the Hugging Face model directory (the GenAI builder makes it from the weights)"


def _openvino(precision: str, device: str, source: DecoderSource, host: HostView) -> tuple[_Made, str | None]:
    prefix = "ov" if device == "CPU" else f"ov-{device.lower()}"
    cpu = device == "CPU"
    fp32 = BuildRecipe(key="ov-fp32", method="ov-export", params={"weights": "f32"}, needs=("hf",))
    compressed = OV_COMPRESSED if cpu else {}
    if precision == "fp32":
        config = OV_EXACT if cpu else {"INFERENCE_PRECISION_HINT": "f32"}
        return [(f"{prefix}-fp32", fp32, dict(config), "FP32 stateful IR, f32 compute and KV cache")], None
    if precision == "bf16":
        if not cpu:
            return [], f"bf16 is a CPU inference precision; {device} takes fp16"
        if not host.cpu_bf16:
            return [], "this CPU does not compute bf16 (no AVX512_BF16 / AMX): the hint would run f32, not judged"
        return [(f"{prefix}-bf16", fp32, dict(OV_BF16), "FP32 IR computed in bf16 (hint), u8 KV cache")], None
    if precision == "fp16":
        if cpu:
            return [], "fp16 is a GPU/NPU precision in OpenVINO; on the CPU, bf16 or f32"
        recipe = BuildRecipe(key="ov-fp16", method="ov-export", params={"weights": "f16"}, needs=("hf",))
        return [(f"{prefix}-fp16", recipe, {"INFERENCE_PRECISION_HINT": "f16"}, "FP16 weights, f16 hint")], None
    if precision == "int8-weights":
        recipe = BuildRecipe(key="ov-int8", method="ov-nncf", base=fp32, params={"mode": "INT8_ASYM"})
        return [(f"{prefix}-int8", recipe, dict(compressed), "INT8 weight-only (NNCF INT8_ASYM, per channel)")], None
    if precision == "int4-weights":
        plain = BuildRecipe(key="ov-int4", method="ov-nncf", base=fp32,
                            params={"mode": "INT4_SYM", "group_size": GROUP_SIZE, "ratio": 1.0})  # fmt: skip
        awq = BuildRecipe(
            key="ov-int4-awq", method="ov-nncf", base=fp32, needs=("hf", "calibration"),
            params={"mode": "INT4_SYM", "group_size": GROUP_SIZE, "ratio": 1.0, "awq": True, "scale_estimation": True},
        )  # fmt: skip
        return [
            (f"{prefix}-int4", plain, dict(compressed),
             f"INT4 weight-only (NNCF INT4_SYM, group {GROUP_SIZE}, ratio 1.0; embedding/head INT8)"),
            (f"{prefix}-int4-awq", awq, dict(compressed),
             f"INT4 weight-only (NNCF INT4_SYM, group {GROUP_SIZE}, AWQ + scale estimation on the calibration text)"),
        ], None  # fmt: skip
    return [], f"{precision} is not an OpenVINO GenAI precision"
