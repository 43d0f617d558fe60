"""Recipe search for one profile: enumerate what its targets allow, build and gate each candidate (retrying a
quantized model that misses the budget with other calibrations, then with its worst layers left in float),
time the measurable ones in interleaved rounds, and keep the fastest inside the budget."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import onnx

from edgefleet.converter.accuracy import Budget
from edgefleet.converter.candidates import Built, Spec, build
from edgefleet.converter.context import Context
from edgefleet.converter.measure import LatencyStats, interleaved_latency
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.prepare import Prepared, dynamic_inputs, prepare
from edgefleet.converter.recipes import Candidate, Choice, choose
from edgefleet.converter.targets import TargetStatus, target_label, target_status
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import CustomOp
from edgefleet.core.profiles import HostFacts, Profile, Target

log = logging.getLogger(__name__)

RETRY_CALIBRATIONS: tuple[prec.CalibrationName, ...] = ("percentile", "entropy")
QUANT_RETRY_KINDS = ("ort-int8-static", "ov-nncf")
EXCLUDE_STEPS = (3, 10)  # worst layers kept in float on successive retries


@dataclass
class ProfileSearch:
    profile: Profile
    budget: Budget
    notes: list[str] = field(default_factory=list)
    built: list[tuple[Built, Target, TargetStatus, int]] = field(default_factory=list)
    latencies: dict[str, LatencyStats] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    choice: Choice | None = None
    layer_reports: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    def winner(self) -> tuple[Built, Target, TargetStatus] | None:
        if self.choice is None or self.choice.chosen is None:
            return None
        name = self.choice.chosen.name
        return next((b, t, s) for b, t, s, _ in self.built if b.spec.name == name)


def search(
    ctx: Context, profile: Profile, budget: Budget, facts: HostFacts, providers: frozenset[str]
) -> ProfileSearch:
    result = ProfileSearch(profile, budget)
    order = 0
    custom = _source_custom_ops(ctx)
    for target in profile.targets:
        status = target_status(profile, target, facts, providers)
        label = target_label(target)
        if not status.buildable:
            result.notes.append(f"{label}: {status.reason}")
            continue
        ops_plan = cops.plan(custom, ctx.custom_op_policy, target.runtime, target.format)
        if ops_plan.blocked:
            why = "; ".join(f"{op}: {reason}" for op, reason in ops_plan.blocked.items())
            result.notes.append(f"{label}: cannot run custom operators: {why}")
            continue
        if not status.measurable:
            result.notes.append(f"{label}: latency not measured: {status.reason}")
        if ops_plan.keep:
            result.notes.append(f"{label}: keeps custom operators {', '.join(ops_plan.keep)} (the device needs them)")
        prepared = prepare(
            ctx, profile.opset.min, profile.opset.max, target.static_shapes, budget, decompose=ops_plan.decompose
        )
        if prepared.model is None:
            result.notes.append(f"{label}: {prepared.error}")
            continue
        result.notes.extend(f"{label}: {n}" for n in prepared.notes if f"{label}: {n}" not in result.notes)
        for precision in target.precisions:
            for built in _attempts(ctx, profile, target, status, prepared, precision, budget, result):
                order += 1
                result.built.append((built, target, status, order))
                result.notes.extend(f"{built.spec.name}: {n}" for n in built.notes)
                if built.error is None and built.gate is None:
                    break
    _measure(ctx, result)
    result.candidates = [_candidate(b, t, s, o, result.latencies) for b, t, s, o in result.built]
    result.choice = choose(
        result.candidates,
        reference=ctx.ref_value,
        max_drop=budget.allowed_drop(ctx.plan.name, ctx.ref_value),
        size_limit_bytes=int(profile.size_limit_mb * 1e6),
    )
    return result


def _source_custom_ops(ctx: Context) -> list[CustomOp]:
    if "custom-ops" not in ctx.memo:
        ctx.memo["custom-ops"] = cops.custom_ops(ctx.source.proto)
    found: list[CustomOp] = ctx.memo["custom-ops"]
    return found


def _suffix(target: Target, prepared_static: bool) -> str:
    runtime = {"openvino": "ov", "coreml": "coreml", "onnxruntime-web": "web"}.get(target.runtime, "ort")
    if target.format == "onnx-tensorrt":
        runtime = "trt"
    device = target.providers[0].split(":")[-1].lower() if target.runtime == "openvino" else ""
    return runtime + (f"-{device}" if device and device != "cpu" else "") + ("-static" if prepared_static else "")


def _attempts(
    ctx: Context,
    profile: Profile,
    target: Target,
    status: TargetStatus,
    prepared: Prepared,
    precision: str,
    budget: Budget,
    result: ProfileSearch,
) -> Iterator[Built]:
    """Candidates for one precision, in order; the caller stops at the first inside the budget."""
    base = _suffix(target, prepared.static_from_data)
    run_on = status.run_on
    hint = target.inference_precision_hint
    first: Built | None = None
    for spec in _first_specs(base, target, run_on, hint, precision):
        ctx.progress(f"{profile.name}: building {spec.name}")
        first = build(ctx, prepared, spec, budget)
        yield first
    if first is None:
        return
    if first.error and not prepared.static_from_data and dynamic_inputs(prepared.model or onnx.ModelProto()):
        # OpenVINO (and some EPs) cannot compile graphs whose control flow depends on dynamic shapes: retry
        # with the dimensions the data uses.
        static = prepare(ctx, profile.opset.min, profile.opset.max, True, budget, decompose=prepared.decomposed)
        if static.model is not None:
            yield from _attempts(ctx, profile, target, status, static, precision, budget, result)
        return
    if first.error or first.gate is None or precision != "int8-static" or first.spec.kind not in QUANT_RETRY_KINDS:
        return  # TensorRT's INT8 is calibrated on the device from the table: nothing to retry here
    if first.spec.kind == "ort-int8-static":
        assert isinstance(first.spec.config, prec.StaticConfig)
        config = first.spec.config
        for method in RETRY_CALIBRATIONS:
            spec = replace(first.spec, name=f"{base}-int8-static-{method}",
                           config=dataclasses_replace(config, calibration=method))  # fmt: skip
            ctx.progress(f"{profile.name}: retrying INT8 with {method} calibration")
            built = build(ctx, prepared, spec, budget)
            yield built
            if built.error is None and built.gate is None:
                return
    if first.spec.kind == "ov-nncf":
        spec = Spec(f"{base}-int8-nncf-mixed", "ov-nncf", precision, target.runtime, target.format, run_on,
                    ovp.NNCFConfig(preset="mixed"), hint=hint)  # fmt: skip
        ctx.progress(f"{profile.name}: retrying NNCF INT8 with the mixed preset")
        built = build(ctx, prepared, spec, budget)
        yield built
        if built.error is None and built.gate is None:
            return
    worst = _worst_layers(ctx, prepared, target, result, budget)
    for count in EXCLUDE_STEPS:
        names = tuple(worst[: 2 * count])
        if not names:
            return
        if first.spec.kind == "ort-int8-static":
            assert isinstance(first.spec.config, prec.StaticConfig)
            config = dataclasses_replace(first.spec.config, exclude_nodes=names)
            spec = replace(first.spec, name=f"{base}-int8-static-exclude{count}", config=config)
        else:
            spec = Spec(f"{base}-int8-nncf-exclude{count}", "ov-nncf", precision, target.runtime, target.format,
                        run_on, ovp.NNCFConfig(preset="mixed", ignored_nodes=names), hint=hint)  # fmt: skip
        ctx.progress(f"{profile.name}: retrying INT8 with the {count} worst layers in float")
        built = build(ctx, prepared, spec, budget)
        yield built
        if built.error is None and built.gate is None:
            return


def dataclasses_replace(config: prec.StaticConfig, **changes: object) -> prec.StaticConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def _first_specs(base: str, target: Target, run_on: str, hint: str | None, precision: str) -> list[Spec]:
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
    specs = _ort_specs(base, target, run_on, hint, precision)
    return [replace(s, ort_format=True) for s in specs] if target.ort_format else specs


def _ort_specs(base: str, target: Target, run_on: str, hint: str | None, precision: str) -> list[Spec]:
    rt, fmt = target.runtime, target.format
    if rt == "openvino":
        if precision == "fp32":
            return [Spec(f"{base}-fp32", "ov", precision, rt, fmt, run_on, hint="f32" if hint == "f16" else hint)]
        if precision == "fp16":
            return [Spec(f"{base}-fp16", "ov", precision, rt, fmt, run_on, hint=hint, compress_to_fp16=True)]
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


def _worst_layers(ctx: Context, prepared: Prepared, target: Target, result: ProfileSearch, budget: Budget) -> list[str]:
    """Names of the nodes whose quantized outputs lose most (qdq_loss_debug SQNR), worst first."""
    key = f"layers:{prepared.sha}"
    if key not in ctx.memo:
        assert prepared.model is not None
        base = _suffix(target, prepared.static_from_data)
        spec = Spec(f"{base}-int8-static-debug", "ort-int8-static", "int8-static", "onnxruntime", "onnx",
                    "CPUExecutionProvider", prec.StaticConfig(activations=target.int8_activations))  # fmt: skip
        try:
            qdq = prec.quantize_int8_static(prepared.model, spec.config, ctx.calib)  # type: ignore[arg-type]
            report = prec.layer_report(prepared.model, qdq, ctx.calib)
        except ConversionError as err:
            result.notes.append(f"per-layer report unavailable: {err}")
            ctx.memo[key] = []
        else:
            worst = report.worst(max(EXCLUDE_STEPS))
            result.layer_reports[prepared.sha[:12]] = [
                {"node": w.node, "op_type": w.op_type, "tensor": w.tensor, "sqnr_db": round(w.sqnr_db, 2)}
                for w in worst
            ]
            # ORT excludes by node name; OpenVINO names converted ops after their output tensors: keep both.
            names = [name for w in worst for name in (w.node, w.tensor) if name]
            result.notes.append(
                "worst quantized layers (SQNR dB): "
                + ", ".join(f"{w.node or w.tensor} {w.sqnr_db:.1f}" for w in worst[:5])
            )
            ctx.memo[key] = list(dict.fromkeys(names))
    names_out: list[str] = ctx.memo[key]
    return names_out


def _measure(ctx: Context, result: ProfileSearch) -> None:
    runners = {}
    for built, _target, status, _order in result.built:
        if built.error is None and status.measurable and built.spec.name not in runners:
            try:
                runners[built.spec.name] = built.runner(ctx.threads, list(ctx.reference))
            except ConversionError as err:
                built.error = str(err)
    if runners:
        ctx.progress(f"{result.profile.name}: timing {len(runners)} candidates in interleaved rounds")
        result.latencies = interleaved_latency(runners, ctx.evaluation)


def _candidate(
    built: Built, target: Target, status: TargetStatus, order: int, lat: dict[str, LatencyStats]
) -> Candidate:
    stats = lat.get(built.spec.name)
    return Candidate(
        name=built.spec.name,
        precision=built.spec.precision,
        runtime=built.spec.runtime,
        size_bytes=built.size_bytes if built.error is None else 0,
        accuracy=built.score.value if built.score else None,
        latency_ms=stats.median_ms if stats else None,
        error=built.error,
        format=built.spec.format,
        provider=target.providers[0] if status.measurable else f"{status.run_on} (proxy for {target.providers[0]})",
        measured=status.measurable,
        gate=built.gate,
        sqnr_db=built.score.sqnr_db if built.score else None,
        max_abs=built.score.max_abs if built.score else None,
        p90_ms=stats.p90_ms if stats else None,
        order=order,
    )
