"""Recipe search for one profile: enumerate what its targets allow, build and gate each candidate (retrying a
quantized model that misses the budget with other calibrations, then in mixed precision: converter.precision_mixed),
time the measurable ones in interleaved rounds, and keep the fastest inside the budget."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from edgefleet.converter import phases
from edgefleet.converter.accuracy import Budget
from edgefleet.converter.candidates import Built, Spec
from edgefleet.converter.candidates import build as build_candidate
from edgefleet.converter.context import Context
from edgefleet.converter.head_to_head import HeadToHead
from edgefleet.converter.heads import head_nodes
from edgefleet.converter.measure import LatencyStats, Runner
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.precision_mixed import mixed_attempts
from edgefleet.converter.prepare import Prepared, dynamic_inputs, prepare
from edgefleet.converter.pruning import Pruner, TimedRunner, retries_cannot_win
from edgefleet.converter.recipes import Candidate, Choice, choose
from edgefleet.converter.search_record import candidate_of, search_report
from edgefleet.converter.targets import TargetStatus, target_label, target_status
from edgefleet.converter.timing import final_round, measure
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import CustomOp
from edgefleet.core.profiles import HostFacts, Profile, Target

log = logging.getLogger(__name__)
__all__ = ["ProfileSearch", "bf16_native", "search", "search_report"]

RETRY_CALIBRATIONS: tuple[prec.CalibrationName, ...] = ("percentile", "entropy")
QUANT_RETRY_KINDS = ("ort-int8-static", "ov-nncf")


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
    threads: list[int] = field(default_factory=list)  # thread counts timed at; the first decides the choice
    by_threads: dict[str, dict[int, LatencyStats]] = field(default_factory=dict)
    prune: bool = True  # converter.pruning: off when devices, not this host, measure the candidates
    stopped: dict[str, str] = field(default_factory=dict)  # timing stopped these (converter.timing), and why
    head_to_head: HeadToHead | None = None  # the finalists re-timed together, and the decision

    def winner(self) -> tuple[Built, Target, TargetStatus] | None:
        if self.choice is None or self.choice.chosen is None:
            return None
        name = self.choice.chosen.name
        return next((b, t, s) for b, t, s, _ in self.built if b.spec.name == name)


def search(
    ctx: Context, profile: Profile, budget: Budget, facts: HostFacts, providers: frozenset[str], prune: bool = True
) -> ProfileSearch:
    """`prune`: drop candidates this host's timing says cannot win (off when devices measure the candidates)."""
    result = ProfileSearch(profile, budget, prune=prune)
    result.threads = list(profile.threads) or [ctx.threads]
    work: list[tuple[int, Target, TargetStatus, Prepared, str]] = []  # (preference order, ...) per precision
    custom = _source_custom_ops(ctx)
    for index, target in enumerate(profile.targets):
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
        with phases.phase("prepare"):
            prepared = prepare(
                ctx, profile.opset.min, profile.opset.max, target.static_shapes, budget, decompose=ops_plan.decompose
            )
        if prepared.model is None:
            result.notes.append(f"{label}: {prepared.error}")
            continue
        result.notes.extend(f"{label}: {n}" for n in prepared.notes if f"{label}: {n}" not in result.notes)
        work.extend((index * 100 + rank, target, status, prepared, p) for rank, p in enumerate(target.precisions))
    pruner = Pruner()
    for done, (order, target, status, prepared, precision) in enumerate(sorted(work, key=build_cost_key)):
        phases.step("build", done, len(work), f"{target.runtime} {precision}")
        if _spent(ctx) and precision != "fp32":
            result.notes.append(f"{target_label(target)}: {precision} not tried: the time budget is spent")
            continue
        _build_precision(ctx, profile, target, status, prepared, precision, budget, result, pruner, order * 100)
    phases.step("build", len(work), len(work), "done")
    runners = measure(ctx, result)
    result.candidates = [candidate_of(b, t, s, o, result.latencies) for b, t, s, o in result.built]
    result.choice = choose(
        result.candidates,
        reference=ctx.ref_value,
        max_drop=budget.allowed_drop(ctx.plan.name, ctx.ref_value),
        size_limit_bytes=int(profile.size_limit_mb * 1e6),
    )
    final_round(ctx, result, runners)  # the best re-timed together decide; what timing stopped is refused
    result.candidates = [candidate_of(b, t, s, o, result.latencies) for b, t, s, o in result.built]
    return result


def build_cost_key(item: tuple[int, Target, TargetStatus, Prepared, str]) -> tuple[int, int, int]:
    """Cheap recipes first (no calibration), so the first candidates inside the budget bound the costly ones;
    among INT8 static, ONNX Runtime's QDQ first: its model also ranks the layers the ORT exclusion search keeps
    in float (converter.precision_mixed)."""
    return (CALIBRATED.get(item[4], 0), item[1].runtime != "onnxruntime", item[0])


CALIBRATED = {"int8-dynamic": 1, "int8-static": 2}
TIMING_RESERVE_S = 10.0  # kept from --time-budget for the timing rounds and the bundle


def _spent(ctx: Context, need_s: float = 0.0) -> bool:
    """Whether --time-budget leaves less than `need_s` for another build, the timing reserve kept aside."""
    return ctx.deadline is not None and time.monotonic() + need_s + TIMING_RESERVE_S > ctx.deadline


def _build_precision(
    ctx: Context,
    profile: Profile,
    target: Target,
    status: TargetStatus,
    prepared: Prepared,
    precision: str,
    budget: Budget,
    result: ProfileSearch,
    pruner: Pruner,
    order: int,
) -> None:
    """One precision's candidates in order, until one is inside the budget, the time budget is spent, or the
    plain quantized model shows that its retries cannot win."""
    bound: list[float] = []  # the first built candidate's evaluation times: its retries are no faster
    prune = pruner if status.measurable and result.prune else None
    started = time.monotonic()
    for built in _attempts(ctx, profile, target, status, prepared, precision, budget, result, prune):
        took, started = time.monotonic() - started, time.monotonic()
        order += 1
        result.built.append((built, target, status, order))
        result.notes.extend(f"{built.spec.name}: {n}" for n in built.notes)
        if built.error is None and built.gate is None:
            if prune is not None and built.size_bytes <= profile.size_limit_mb * 1e6:
                pruner.accept(built.spec.name, _evidence(ctx, built, result), _runner_of(ctx, built, result))
            return
        if _spent(ctx, took):
            result.notes.append(f"{built.spec.name}: no further retries: the time budget is spent (a retry takes "
                                f"about {took:.0f} s, and the timing needs {TIMING_RESERVE_S:.0f} s)")  # fmt: skip
            return
        # Each retry keeps at least as much in float as the one before: the latest is the tightest bound.
        bound = built.eval_ms if len(built.eval_ms) >= len(bound) else bound
        if prune is not None and built.error is None and prune.beaten(bound):
            why = _confirm(ctx, built, result, prune)
            if why:
                result.notes.append(f"{built.spec.name}: retries not built: {why.removeprefix('pruned: ')}")
                return


def _evidence(ctx: Context, built: Built, result: ProfileSearch) -> list[float]:
    """Latency evidence for a candidate inside the budget: its evaluation times, or a few runs when it came
    from the build cache."""
    if built.eval_ms:
        return built.eval_ms
    try:
        timed = TimedRunner(built.runner(result.threads[0], list(ctx.reference)), None)
        with phases.phase("timing"):
            for index in range(min(5, len(ctx.evaluation))):
                timed(ctx.evaluation.sample(index))
    except (ConversionError, RuntimeError, ValueError):
        return []
    built.eval_ms = timed.samples_ms
    return timed.samples_ms


def _runner_of(ctx: Context, built: Built, result: ProfileSearch) -> Callable[[], Runner]:
    return lambda: built.runner(result.threads[0], list(ctx.reference))


def _confirm(ctx: Context, built: Built, result: ProfileSearch, pruner: Pruner) -> str | None:
    """Head to head against the best candidate inside the budget: can this quantized model (and so its retries,
    which keep more in float) still win?"""
    try:
        run = built.runner(result.threads[0], list(ctx.reference))
        with phases.phase("timing"):
            return pruner.confirm(run, ctx.evaluation.sample(0))
    except ConversionError:
        return None


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
    pruner: Pruner | None = None,
) -> Iterator[Built]:
    """Candidates for one precision, in order; the caller stops at the first inside the budget."""

    def build(ctx: Context, prepared: Prepared, spec: Spec, budget: Budget) -> Built:
        if not status.measurable and spec.precision.startswith("int8"):
            spec = replace(spec, as_written=True)  # a proxy: the graph's int8 arithmetic, not this CPU's
        return build_candidate(ctx, prepared, spec, budget, threads=result.threads[0], pruner=pruner)

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
    if (
        first.error
        and not first.pruned
        and not first.error.startswith("not suited")
        and not prepared.static_from_data
        and dynamic_inputs(prepared.model or onnx.ModelProto())
    ):
        # OpenVINO (and some EPs) cannot compile graphs whose control flow depends on dynamic shapes: retry
        # with the dimensions the data uses.
        with phases.phase("prepare"):
            static = prepare(ctx, profile.opset.min, profile.opset.max, True, budget, decompose=prepared.decomposed)
        if static.model is not None:
            yield from _attempts(ctx, profile, target, status, static, precision, budget, result, pruner)
        return
    if first.error or first.gate is None or precision != "int8-static" or first.spec.kind not in QUANT_RETRY_KINDS:
        return  # TensorRT's INT8 is calibrated on the device from the table: nothing to retry here
    bf16 = "bf16" in target.precisions and bf16_native(run_on)
    why = _retries_cannot_win(ctx, first, result, pruner, bf16) if pruner is not None else None
    if why:
        result.notes.append(f"{first.spec.name}: no retries (calibrations, float layers, mixed precision): {why}")
        return
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
    assert prepared.model is not None
    if ctx.plan.kind == "detection":  # a detector's head decides its detections: keep it in float first
        names = tuple(head_nodes(prepared.model, list(ctx.reference)))
        if first.spec.kind == "ort-int8-static":
            assert isinstance(first.spec.config, prec.StaticConfig)
            config = dataclasses_replace(first.spec.config, exclude_nodes=names)
            spec = replace(first.spec, name=f"{base}-int8-static-head-float", config=config)
        else:
            spec = Spec(f"{base}-int8-nncf-head-float", "ov-nncf", precision, target.runtime, target.format,
                        run_on, ovp.NNCFConfig(preset="mixed", ignored_nodes=names), hint=hint)  # fmt: skip
        ctx.progress(f"{profile.name}: retrying INT8 with the head in float")
        built = build(ctx, prepared, spec, budget)
        yield built
        if (built.error is None and built.gate is None) or ctx.out_of_time():
            return
    yield from mixed_attempts(ctx, prepared, first, base, budget, result.notes, result.layer_reports, bf16)


def _retries_cannot_win(ctx: Context, first: Built, result: ProfileSearch, pruner: Pruner, bf16: bool) -> str | None:
    """converter.pruning.retries_cannot_win, with `first` compiled with the fastest hint a retry gets (bf16
    where NNCF's accuracy-control variants try it)."""
    bound = first
    if first.spec.kind == "ov-nncf" and bf16 and first.spec.hint != "bf16":
        bound = replace(first, spec=replace(first.spec, hint="bf16"))
    note = " (compiled with the bf16 hint its variants get)" if bound is not first else ""
    precisions = {b.spec.name: b.spec.precision for b, *_ in result.built}
    try:
        run = bound.runner(result.threads[0], list(ctx.reference))
        with phases.phase("timing"):
            return retries_cannot_win(pruner, run, ctx.evaluation.sample(0), first.spec.precision, precisions, note)
    except ConversionError:
        return None


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
