"""The plan stage: a profile → its targets, what this machine can do for each, and the declared recipes as
ordered pass lists (Spec), cheapest to build first.

A target is *buildable* when the converter knows how to produce its format, and *measurable* when this host
is the profile's hardware and has the target's runtime and device; a buildable target that is not measurable
is built and its accuracy checked on this host's CPU (a proxy), but its latency is not measured.

Proxies: TensorRT bundles run here as the same recipe on the CPU EP (the engine is built on the device);
onnxruntime-web bundles on the CPU EP (the WASM EP's kernels are the CPU kernels compiled to WebAssembly);
CoreML packages off macOS as the onnx2torch module in torch with the recipe emulated.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.passes import transformer as tfm
from edgefleet.converter.quantized import Arrived
from edgefleet.converter.runners import openvino_devices
from edgefleet.converter.search.request import SearchRequest, arrives_quantized
from edgefleet.converter.search.types import Source, Spec
from edgefleet.core.profiles import HostFacts, Profile, Target, match_reasons


@dataclass(frozen=True)
class TargetStatus:
    buildable: bool
    measurable: bool
    run_on: str  # the provider / OpenVINO device used on this host (for accuracy, and latency when measurable)
    reason: str  # why not buildable, or why latency is not measured


def target_label(target: Target) -> str:
    return f"{target.runtime}/{target.format} [{', '.join(target.providers)}]"


def target_status(profile: Profile, target: Target, facts: HostFacts, ort_providers: frozenset[str]) -> TargetStatus:
    misses = match_reasons(profile, facts)
    if target.runtime == "coreml":
        missing = cml.missing_packages()
        if missing:
            return TargetStatus(False, False, "", missing)
        if platform.system() != "Darwin":
            return TargetStatus(
                True, False, "torch", "CoreML predicts only on macOS: accuracy from the onnx2torch module in torch"
            )
        if misses:
            return TargetStatus(True, False, "torch", f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, target.providers[0], "")
    if target.runtime == "onnxruntime-web":
        return TargetStatus(
            True, False, "CPUExecutionProvider", "runs in a web browser: accuracy on the CPU EP, whose kernels the "
            "WASM EP compiles to WebAssembly; latency is measured in the browser, not here"
        )  # fmt: skip
    if target.runtime == "onnxruntime":
        here = [p for p in target.providers if p in ort_providers]
        if not here:
            return TargetStatus(
                True, False, "CPUExecutionProvider", f"none of {target.providers} is available here (accuracy on the "
                "CPU EP as a proxy)"
            )  # fmt: skip
        if misses:
            return TargetStatus(True, False, here[0], f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, here[0], "")
    if target.runtime == "openvino":
        devices = openvino_devices()
        if not devices:
            return TargetStatus(False, False, "", "the openvino package is not installed (pip install openvino)")
        wanted = [p.split(":", 1)[1] for p in target.providers]
        here = [d for d in wanted if d in devices or (d == "AUTO" and devices)]
        if not here:
            return TargetStatus(
                True, False, "CPU", f"OpenVINO device {'/'.join(wanted)} is not present here (have {list(devices)}); "
                "accuracy on openvino:CPU as a proxy"
            )  # fmt: skip
        if misses:
            return TargetStatus(True, False, "CPU", f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, "CPU" if here[0] == "AUTO" else here[0], "")
    return TargetStatus(False, False, "", f"runtime {target.runtime} is not supported by this converter")


@dataclass(frozen=True)
class PlannedTarget:
    """One of the profile's targets as this machine sees it, and what the plan says of it."""

    index: int  # its place in the profile's order
    target: Target
    status: TargetStatus
    decompose: tuple[str, ...] = ()  # custom ops the target needs replaced by standard ops
    notes: tuple[str, ...] = ()  # what the report says of it (why it is skipped, or not timed)
    skipped: bool = False  # nothing is built for it (notes say why)


@dataclass(frozen=True)
class Recipe:
    """One precision of one target, as the build stage takes them: `order` is the profile's preference; `source`:
    the graph it starts from (the model as given; for a model that arrives quantized, that model kept as it is,
    or its float graph, converter.quantized)."""

    order: int
    target: PlannedTarget
    precision: str
    source: Source = "model"


@dataclass(frozen=True)
class Plan:
    targets: tuple[PlannedTarget, ...]
    recipes: tuple[Recipe, ...] = field(default=())  # cheapest to build first (build_cost_key)


def plan(request: SearchRequest, profile: Profile, facts: HostFacts, providers: frozenset[str]) -> Plan:
    """The profile's targets with their status on this machine and the recipes to build, in build order."""
    planned: list[PlannedTarget] = []
    for index, target in enumerate(profile.targets):
        status = target_status(profile, target, facts, providers)
        label = target_label(target)
        if not status.buildable:
            planned.append(PlannedTarget(index, target, status, notes=(f"{label}: {status.reason}",), skipped=True))
            continue
        arrived = request.source.quantization if arrives_quantized(request.source) else None
        refused = _cannot_run(arrived, target, request.openvino_converts) if arrived is not None else None
        if refused:
            assert arrived is not None
            note = f"{label}: the model arrives quantized ({arrived.describe()}), and {refused}: refused"
            planned.append(PlannedTarget(index, target, status, notes=(note,), skipped=True))
            continue
        custom = list(request.custom_ops)
        if arrived is not None and target.runtime == "openvino" and request.openvino_converts:
            custom = [op for op in custom if op.domain != "com.microsoft"]  # its front end takes them
        ops_plan = cops.plan(custom, request.custom_op_policy, target.runtime, target.format)
        if ops_plan.blocked:
            why = "; ".join(f"{op}: {reason}" for op, reason in ops_plan.blocked.items())
            note = f"{label}: cannot run custom operators: {why}"
            planned.append(PlannedTarget(index, target, status, notes=(note,), skipped=True))
            continue
        notes = []
        if not status.measurable:
            notes.append(f"{label}: latency not measured: {status.reason}")
        if ops_plan.keep:
            notes.append(f"{label}: keeps custom operators {', '.join(ops_plan.keep)} (the device needs them)")
        planned.append(PlannedTarget(index, target, status, tuple(ops_plan.decompose), tuple(notes)))
    if arrives_quantized(request.source):
        return _quantized_plan(request, planned)
    recipes = [
        Recipe(p.index * 100 + rank, p, precision)
        for p in planned
        if not p.skipped
        for rank, precision in enumerate(p.target.precisions)
    ]
    if request.encoder is not None:
        planned, extra = _encoder_recipes(request.encoder, planned)
        recipes += extra
    return Plan(tuple(planned), tuple(sorted(recipes, key=build_cost_key)))


def _encoder_recipes(encoder: tfm.Encoder, planned: list[PlannedTarget]) -> tuple[list[PlannedTarget], list[Recipe]]:
    """An encoder's extra recipes: weight-only INT8 (and INT4 on ONNX Runtime) where a target takes INT8, and on
    ONNX Runtime's own format the fused graph (converter.passes.transformer) at FP32 and dynamic INT8."""
    out, recipes = [], []
    for target in planned:
        runtime, fmt = target.target.runtime, target.target.format
        if target.skipped or runtime not in ("onnxruntime", "openvino") or fmt not in ("onnx", "openvino-ir"):
            out.append(target)
            continue
        extra = []
        if any(p.startswith("int8") for p in target.target.precisions):
            extra += [Recipe(target.index * 100 + 50, target, "int8-weights")]
            if runtime == "onnxruntime":
                extra += [Recipe(target.index * 100 + 51, target, "int4-weights")]
        if runtime == "onnxruntime":
            extra += [Recipe(target.index * 100 + 60, target, "fp32", "fused")]
            if "int8-dynamic" in target.target.precisions:
                extra += [Recipe(target.index * 100 + 61, target, "int8-dynamic", "fused")]
        added = ", ".join(r.precision + (" (fused graph)" if r.source == "fused" else "") for r in extra)
        note = f"{target_label(target.target)}: a transformer encoder ({encoder.describe()}): {added} added"
        out.append(replace(target, notes=(*target.notes, note)) if extra else target)
        recipes += extra
    return out, recipes


def _quantized_plan(request: SearchRequest, planned: list[PlannedTarget]) -> Plan:
    """A model that arrives quantized is never quantized again blindly: each target keeps it as it is where its
    runtime runs the operators (else it is refused, saying why); where it has a float graph, the target's usual
    recipes start from that too, and ship only where the gate and the timing prove they pay."""
    arrived = request.source.quantization
    assert arrived is not None
    out: list[PlannedTarget] = []
    recipes: list[Recipe] = []
    for target in planned:
        if target.skipped:
            out.append(target)
            continue
        label = target_label(target.target)
        notes = [f"{label}: the model arrives quantized ({arrived.describe()}): kept as it is, never quantized again"]
        recipes.append(Recipe(target.index * 100, target, arrived.precision, "as-quantized"))
        if request.dequantized is not None:
            precisions = ", ".join(target.target.precisions)
            notes.append(f"{label}: its float graph (the weights dequantized, each activation pair its Clip) is "
                         f"offered to the {precisions} recipes, which ship only where the gate and the timing prove "
                         "they pay")  # fmt: skip
            recipes.extend(
                Recipe(target.index * 100 + 1 + rank, target, precision, "dequantized")
                for rank, precision in enumerate(target.target.precisions)
            )
        else:
            notes.append(f"{label}: not dequantized: only QDQ and DequantizeLinear weight-only graphs have a float "
                         f"graph here (this one is {arrived.primary})")  # fmt: skip
        out.append(replace(target, notes=(*target.notes, *notes)))
    ordered = sorted(recipes, key=lambda r: (r.source != "as-quantized", build_cost_key(r)))
    return Plan(tuple(out), tuple(ordered))


def _cannot_run(arrived: Arrived, target: Target, openvino_converts: bool | None) -> str | None:
    """Why `target` cannot ship the model as it arrives (None: it can)."""
    if arrived.contrib_ops and target.runtime not in ("onnxruntime", "openvino"):
        return f"{target.runtime} cannot run its com.microsoft operators {', '.join(arrived.contrib_ops)}"
    if target.runtime == "openvino" and openvino_converts is False:
        ops = ", ".join(arrived.contrib_ops) or "com.microsoft operators"
        return f"OpenVINO's converter cannot take its {ops}"
    if target.runtime == "coreml":
        return "onnx2torch, through which CoreML packages are made, has no quantized operators"
    if target.format == "onnx-tensorrt":
        return "the TensorRT bundle's own FP16/INT8 preparation would quantize it again"
    return None


def quantized_specs(base: str, target: Target, run_on: str, hint: str | None, precision: str) -> list[Spec]:
    """The model as it arrives, as a candidate: the graph itself on ONNX Runtime (and its web build), its OpenVINO
    IR at the target's hint on OpenVINO."""
    name = f"{base}-as-quantized"
    if target.runtime == "openvino":
        return [Spec(name, "ov", precision, target.runtime, target.format, run_on, hint=hint)]
    spec = Spec(name, "ort-fp32", precision, target.runtime, target.format, run_on)
    return [replace(spec, ort_format=True)] if target.ort_format else [spec]


def build_cost_key(recipe: Recipe) -> tuple[int, int, int]:
    """Cheap recipes first (no calibration), so the first candidates inside the budget bound the costly ones;
    among INT8 static, ONNX Runtime's QDQ first: its model also ranks the layers the ORT exclusion search keeps
    in float (converter.search.mixed)."""
    return (CALIBRATED.get(recipe.precision, 0), recipe.target.target.runtime != "onnxruntime", recipe.order)


CALIBRATED = {"int8-dynamic": 1, "int8-weights": 1, "int4-weights": 1, "int8-static": 2}


def spec_base(target: Target, prepared_static: bool) -> str:
    runtime = {"openvino": "ov", "coreml": "coreml", "onnxruntime-web": "web"}.get(target.runtime, "ort")
    if target.format == "onnx-tensorrt":
        runtime = "trt"
    device = target.providers[0].split(":")[-1].lower() if target.runtime == "openvino" else ""
    return runtime + (f"-{device}" if device and device != "cpu" else "") + ("-static" if prepared_static else "")


def declared_specs(
    base: str, target: Target, run_on: str, hint: str | None, precision: str, transformer: bool = False
) -> list[Spec]:
    """The recipe a precision declares for a target, as pass lists; `transformer`: an encoder's (converter.passes.
    transformer): INT8 per channel with its softmax, normalizations and additions in float, NNCF's transformer
    scheme with SmoothQuant, and weight-only INT8 / INT4 matrix products."""
    rt, fmt = target.runtime, target.format
    if rt == "coreml":
        if precision not in ("fp32", "fp16", "int8-weights"):
            return []
        return [Spec(f"{base}-{precision}", "coreml", precision, rt, fmt, run_on, cml.CoreMLConfig(precision))]  # type: ignore[arg-type]
    if fmt == "onnx-tensorrt":
        if precision not in ("fp32", "fp16", "int8-static"):
            return []
        name = f"{base}-int8-calibrated" if precision == "int8-static" else f"{base}-{precision}"
        return [Spec(name, "trt", precision, rt, fmt, run_on, trt.TensorRTConfig(precision))]  # type: ignore[arg-type]
    specs = _transformer_specs(base, target, run_on, hint, precision) if transformer else []
    specs = specs or _ort_specs(base, target, run_on, hint, precision)
    return [replace(s, ort_format=True) for s in specs] if target.ort_format else specs


def _transformer_specs(base: str, target: Target, run_on: str, hint: str | None, precision: str) -> list[Spec]:
    rt, fmt = target.runtime, target.format
    if rt == "openvino":
        if precision == "int8-static":
            config = ovp.NNCFConfig(model_type="transformer")
            return [Spec(f"{base}-int8-nncf-transformer", "ov-nncf", precision, rt, fmt, run_on, config, hint=hint)]
        if precision == "int8-weights":
            config_c = ovp.CompressConfig("int8_asym")
            return [Spec(f"{base}-int8-weights", "ov-compress", precision, rt, fmt, run_on, config_c, hint=hint)]
        return []
    if precision == "int8-dynamic":
        config_d = prec.DynamicConfig(op_types=("MatMul", "Gemm", "Attention"), per_channel=True,
                                      reduce_range=target.int8_reduce_range, min_matmul_share=0.2,
                                      default_float=True)  # fmt: skip
        return [Spec(f"{base}-int8-dynamic-pc", "ort-int8-dynamic", precision, rt, fmt, run_on, config_d)]
    if precision == "int8-static":
        config_s = prec.StaticConfig(activations=target.int8_activations, reduce_range=target.int8_reduce_range,
                                     exclude_op_types=tfm.FLOAT_OPS)  # fmt: skip
        return [Spec(f"{base}-int8-static-transformer", "ort-int8-static", precision, rt, fmt, run_on, config_s)]
    if precision in ("int8-weights", "int4-weights"):
        bits = 8 if precision == "int8-weights" else 4
        config_w = prec.WeightOnlyConfig(bits=bits)  # type: ignore[arg-type]
        return [Spec(f"{base}-{precision}", "ort-int8-weights", precision, rt, fmt, run_on, config_w)]
    return []


def _ort_specs(base: str, target: Target, run_on: str, hint: str | None, precision: str) -> list[Spec]:
    rt, fmt = target.runtime, target.format
    if precision in ("int8-weights", "int4-weights"):
        return []  # weight-only recipes are an encoder's (_transformer_specs)
    if rt == "openvino":
        if precision == "fp32":
            return [Spec(f"{base}-fp32", "ov", precision, rt, fmt, run_on, hint="f32" if hint == "f16" else hint)]
        if precision == "fp16":
            return [Spec(f"{base}-fp16", "ov", precision, rt, fmt, run_on, hint=hint, compress_to_fp16=True)]
        if precision == "bf16":
            return [Spec(f"{base}-bf16", "ov", precision, rt, fmt, run_on, hint="bf16")] if bf16_native(run_on) else []
        if precision == "int8-static":
            return [
                Spec(f"{base}-int8-nncf", "ov-nncf", precision, rt, fmt, run_on, ovp.NNCFConfig(), hint=hint),
            ]
        return []
    if precision == "fp32":
        return [Spec(f"{base}-fp32", "ort-fp32", precision, rt, fmt, run_on)]
    if precision == "fp16":
        return [Spec(f"{base}-fp16", "ort-fp16", precision, rt, fmt, run_on, prec.Fp16Config())]
    if precision == "int8-dynamic":
        config = prec.DynamicConfig(reduce_range=target.int8_reduce_range)
        return [Spec(f"{base}-int8-dynamic", "ort-int8-dynamic", precision, rt, fmt, run_on, config)]
    config_s = prec.StaticConfig(activations=target.int8_activations, reduce_range=target.int8_reduce_range)
    name = f"{base}-int8-static-{'u8s8' if target.int8_activations == 'uint8' else 's8s8'}"
    return [Spec(name + ("-reduce-range" if target.int8_reduce_range else ""), "ort-int8-static", precision, rt, fmt,
                 run_on, config_s)]  # fmt: skip


def bf16_native(device: str) -> bool:
    """bf16 inference is worth a candidate only where the CPU computes it natively (AVX512_BF16 or AMX)."""
    if device != "CPU":
        return True
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})
