"""The shared FP32 graph pipeline: pin → fix dims → opset → fold → Conv+BN → cleanup → shapes, gated.

Each step is checked against the FP32 reference on the evaluation set; a step that fails or moves the outputs
(SQNR under GRAPH_PASS_MIN_SQNR_DB, or the metric outside the budget) is dropped and the pipeline goes on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from edgefleet.converter import phases
from edgefleet.converter.accuracy import Budget
from edgefleet.converter.context import Context
from edgefleet.converter.measure import ort_runner, predict
from edgefleet.converter.passes import custom_ops, graph
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import PassRecord

log = logging.getLogger(__name__)
GRAPH_PASS_MIN_SQNR_DB = 50.0


@dataclass
class Prepared:
    model: onnx.ModelProto | None
    passes: list[PassRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    static_from_data: bool = False
    decomposed: tuple[str, ...] = ()  # custom ops replaced by their standard-op decompositions

    @property
    def sha(self) -> str:
        assert self.model is not None
        return hashlib.sha256(self.model.SerializeToString(deterministic=True)).hexdigest()


def dynamic_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [
        vi.name
        for vi in model.graph.input
        if vi.name not in inits and any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
    ]


def shapes_from_data(ctx: Context, names: list[str]) -> dict[str, list[int]]:
    """Per-sample input shapes when every evaluation and calibration sample agrees; ConversionError otherwise."""
    shapes: dict[str, list[int]] = {}
    for name in names:
        seen = {tuple(ds.inputs[name].shape[1:]) for ds in (ctx.evaluation, ctx.calib)}
        if len(seen) != 1:
            raise ConversionError(f"input {name!r} comes in several shapes {sorted(seen)}; pass --fix-dim to choose")
        shapes[name] = list(next(iter(seen)))
    return shapes


def prepare(
    ctx: Context, opset_min: int, opset_max: int, static: bool, budget: Budget, decompose: tuple[str, ...] = ()
) -> Prepared:
    key = f"prepared:{opset_min}:{opset_max}:{static}:{','.join(sorted(decompose))}"
    if key not in ctx.memo:
        ctx.memo[key] = _prepare(ctx, opset_min, opset_max, static, budget, tuple(sorted(decompose)))
    result: Prepared = ctx.memo[key]
    return result


def _prepare(
    ctx: Context, opset_min: int, opset_max: int, static: bool, budget: Budget, decompose: tuple[str, ...]
) -> Prepared:
    model = ctx.source.proto
    if ctx.source.large:  # converter/large_model.py: the graph as exported, run from its path
        return _prepare_large(ctx, model, static, decompose)
    done = Prepared(model, passes=list(ctx.source.passes), decomposed=decompose)
    if decompose:
        # Mandatory when asked for (the target cannot load the op), so a failure or a miss of the gate ends here.
        try:
            candidate = custom_ops.decompose(model, custom_ops.DecomposeConfig(decompose))
            result = ctx.score(predict(ort_runner(candidate, ctx.threads), ctx.evaluation))
        except ConversionError as err:
            return Prepared(None, error=f"cannot decompose custom operators: {err}", decomposed=decompose)
        reason = ctx.gate(result, budget)
        if reason is None and result.sqnr_db < GRAPH_PASS_MIN_SQNR_DB:
            reason = f"SQNR {result.sqnr_db:.1f} dB under {GRAPH_PASS_MIN_SQNR_DB:.0f} dB"
        if reason:
            return Prepared(
                None, error=f"the decomposition of {', '.join(decompose)} misses the accuracy gate: {reason}"
            )
        model = candidate
        done.passes.append(
            PassRecord(
                name="decompose-custom-ops", params={"ops": list(decompose), "sqnr_db": round(result.sqnr_db, 2)}
            )
        )
    if ctx.pins:
        model = graph.pin_inputs(model, graph.PinConfig(ctx.pins))
        done.passes.append(PassRecord(name="pin-inputs", params={k: str(v.tolist()) for k, v in ctx.pins.items()}))
    if ctx.user_dims.dims or ctx.user_dims.shapes:
        model = graph.fix_dims(model, ctx.user_dims)
        done.passes.append(PassRecord(name="fix-dims", params={k: v for k, v in ctx.user_dims.dims.items()}))
    if static:
        names = dynamic_inputs(model)
        if names:
            try:
                shapes = shapes_from_data(ctx, names)
            except ConversionError as err:
                return Prepared(None, done.passes, done.notes, f"static shapes needed: {err}")
            model = graph.fix_dims(model, graph.FixDimsConfig(shapes=shapes))
            done.passes.append(
                PassRecord(name="fix-dims", params={k: str(v) for k, v in shapes.items()} | {"from": "data"})
            )
            done.static_from_data = True
    current = graph.default_opset(model)
    if current and not opset_min <= current <= opset_max:
        wanted = opset_max if current > opset_max else opset_min
        ctx.progress(f"converting opset {current} → {wanted}")
        try:
            model = graph.convert_opset(model, graph.OpsetConfig(wanted))
        except ConversionError as err:
            return Prepared(None, done.passes, done.notes, f"opset {current} outside {opset_min}-{opset_max}: {err}")
        done.passes.append(PassRecord(name="convert-opset", params={"from": current, "to": wanted}))
    steps: list[tuple[str, Callable[[onnx.ModelProto], onnx.ModelProto]]] = [
        ("fold-constants", graph.fold_constants),
        ("fuse-conv-bn", graph.fuse_conv_bn),
        ("remove-redundant", graph.remove_redundant),
        ("shape-inference", graph.infer_shapes),
    ]
    with phases.phase("prepare"):
        chained = _all_steps(ctx, model, steps, budget, done)
        if chained is not None:
            model = chained
        else:  # some step moves the outputs: gate each on its own to find and drop it
            for name, step in steps:
                model = _one_step(ctx, model, name, step, budget, done)
    done.model = model
    log.info("prepared model: %s", [p.name for p in done.passes])
    return done


def _gate_reason(ctx: Context, model: onnx.ModelProto, budget: Budget) -> tuple[str | None, float]:
    result = ctx.score(predict(ort_runner(model, ctx.threads), ctx.evaluation))
    reason = ctx.gate(result, budget)
    if reason is None and result.sqnr_db < GRAPH_PASS_MIN_SQNR_DB:
        reason = f"SQNR {result.sqnr_db:.1f} dB under {GRAPH_PASS_MIN_SQNR_DB:.0f} dB for an FP32 graph pass"
    return reason, result.sqnr_db


def _all_steps(
    ctx: Context,
    model: onnx.ModelProto,
    steps: list[tuple[str, Callable[[onnx.ModelProto], onnx.ModelProto]]],
    budget: Budget,
    done: Prepared,
) -> onnx.ModelProto | None:
    """Every step chained, then one gate on the result (the same gate each step would face, on the model that
    ships); None when the chain misses it. A step that fails on its own is skipped, as in the one-by-one path."""
    records: list[tuple[str, int, int]] = []
    notes: list[str] = []
    for name, step in steps:
        try:
            candidate = step(model)
        except ConversionError as err:
            notes.append(f"{name} skipped: {err}")
            continue
        records.append((name, len(model.graph.node), len(candidate.graph.node)))
        model = candidate
    try:
        reason, sqnr = _gate_reason(ctx, model, budget)
    except ConversionError:
        return None
    if reason:
        return None
    done.notes.extend(notes)
    done.passes.extend(
        PassRecord(name=name, params={"nodes_before": before, "nodes_after": after, "sqnr_db": round(sqnr, 2)})
        for name, before, after in records
    )
    return model


def _one_step(
    ctx: Context,
    model: onnx.ModelProto,
    name: str,
    step: Callable[[onnx.ModelProto], onnx.ModelProto],
    budget: Budget,
    done: Prepared,
) -> onnx.ModelProto:
    try:
        candidate = step(model)
        reason, sqnr = _gate_reason(ctx, candidate, budget)
    except ConversionError as err:
        done.notes.append(f"{name} skipped: {err}")
        return model
    if reason:
        done.notes.append(f"{name} dropped by the accuracy gate: {reason}")
        return model
    before, after = len(model.graph.node), len(candidate.graph.node)
    done.passes.append(
        PassRecord(name=name, params={"nodes_before": before, "nodes_after": after, "sqnr_db": round(sqnr, 2)})
    )
    return candidate


def _prepare_large(ctx: Context, model: onnx.ModelProto, static: bool, decompose: tuple[str, ...]) -> Prepared:
    """A model over protobuf's limit takes no graph pass (each serializes the whole model): the ones a target
    needs are refused, naming them."""
    needed = [
        what
        for what, asked in (
            ("pinned inputs", bool(ctx.pins)), ("fixed dims", bool(ctx.user_dims.dims or ctx.user_dims.shapes)),
            ("static shapes", static and bool(dynamic_inputs(model))), ("custom-op decomposition", bool(decompose)),
        )
        if asked
    ]  # fmt: skip
    if needed:
        return Prepared(
            None, error=f"the model is over protobuf's 2 GiB limit: {', '.join(needed)} would rewrite it as one "
            "protobuf; it is converted as exported only",
        )  # fmt: skip
    return Prepared(model, notes=["graph passes skipped: the model is over protobuf's 2 GiB limit (run from its path)"])


def opset_of(model: onnx.ModelProto) -> dict[str, int]:
    return {(imp.domain or ""): int(imp.version) for imp in model.opset_import}
