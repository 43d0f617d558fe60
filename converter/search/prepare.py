"""The shared FP32 graph pipeline: pin → fix dims → opset → fold → Conv+BN → cleanup → shapes, gated.

Each step is checked against the FP32 reference on the evaluation set; a step that fails or moves the outputs
(SQNR under GRAPH_PASS_MIN_SQNR_DB, or the metric outside the budget) is dropped and the pipeline goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import onnx

from edgefleet.converter import deadline, phases
from edgefleet.converter.onnx_graph import dynamic_inputs
from edgefleet.converter.passes import custom_ops, graph, transformer
from edgefleet.converter.runners import ort_runner, predict
from edgefleet.converter.search.gate import Budget, score
from edgefleet.converter.search.request import SearchRequest, Workspace, arrives_quantized
from edgefleet.converter.search.types import Prepared, Source
from edgefleet.core.bundle.manifest import PassRecord
from edgefleet.core.errors import ConversionError

log = logging.getLogger(__name__)
GRAPH_PASS_MIN_SQNR_DB = 50.0


def shapes_from_data(request: SearchRequest, names: list[str]) -> dict[str, list[int]]:
    """Per-sample input shapes when every evaluation and calibration sample agrees; ConversionError otherwise."""
    shapes: dict[str, list[int]] = {}
    for name in names:
        seen = {tuple(ds.inputs[name].shape[1:]) for ds in (request.evaluation, request.calib)}
        if len(seen) != 1:
            raise ConversionError(f"input {name!r} comes in several shapes {sorted(seen)}; pass --fix-dim to choose")
        shapes[name] = list(next(iter(seen)))
    return shapes


def prepare(
    request: SearchRequest,
    ws: Workspace,
    opset_min: int,
    opset_max: int,
    static: bool,
    budget: Budget,
    decompose: tuple[str, ...] = (),
    source: Source = "model",
) -> Prepared:
    """The source graph through the pipeline, once per conversion for each opset range, shape mode, set of
    decomposed custom ops and source (the model, or the float graph of a model that arrives quantized; kept in the
    workspace's memo)."""
    variant = source if source in ("dequantized", "fused") else "model"
    key = f"prepared:{opset_min}:{opset_max}:{static}:{','.join(sorted(decompose))}:{variant}"
    if key not in ws.memo.prepared:
        if variant == "fused":  # ONNX Runtime's transformer fusions on the graph as exported, gated
            with phases.phase("prepare"):
                ws.memo.prepared[key] = _fused(request, budget)
            return ws.memo.prepared[key]
        with phases.phase("prepare"):
            ws.memo.prepared[key] = _prepare(
                request, ws, opset_min, opset_max, static, budget, tuple(sorted(decompose)), variant == "dequantized"
            )
    return ws.memo.prepared[key]


def _fused(request: SearchRequest, budget: Budget) -> Prepared:
    """converter.passes.transformer.fuse on the graph as exported (its patterns are the exporter's: the pipeline's
    folding would hide the attention from it), with the user's pins and dimensions, checked by the same gate as
    every graph pass."""
    model, passes = request.source.proto, list(request.source.passes)
    if request.pins:
        model = graph.pin_inputs(model, graph.PinConfig(dict(request.pins)))
        passes.append(PassRecord(name="pin-inputs", params={k: str(v.tolist()) for k, v in request.pins.items()}))
    if request.user_dims.dims or request.user_dims.shapes:
        model = graph.fix_dims(model, request.user_dims)
        passes.append(PassRecord(name="fix-dims", params=dict(request.user_dims.dims)))
    try:
        fused, counts = transformer.fuse(model)
        reason, sqnr = _gate_reason(request, fused, budget)
    except ConversionError as err:
        return Prepared(None, error=f"no fused graph: {err}")
    if reason:
        return Prepared(None, error=f"the transformer fusion misses the accuracy gate: {reason}")
    geometry = dict(zip(("num_heads", "hidden_size"), transformer.attention_geometry(model) or (0, 0), strict=True))
    passes.append(
        PassRecord(name="ort-transformer-fusion", params=dict(counts) | geometry | {"sqnr_db": round(sqnr, 2)})
    )
    fused_ops = ", ".join(f"{op} x{n}" for op, n in counts.items())
    return Prepared(fused, passes, [f"ONNX Runtime's transformer fusions: {fused_ops}"])


def _prepare(
    request: SearchRequest,
    ws: Workspace,
    opset_min: int,
    opset_max: int,
    static: bool,
    budget: Budget,
    decompose: tuple[str, ...],
    dequantized: bool = False,
) -> Prepared:
    model = request.source.proto
    if request.source.large:  # converter/large_model.py: the graph as exported, run from its path
        return _prepare_large(request, model, static, decompose)
    done = Prepared(model, passes=list(request.source.passes), decomposed=decompose)
    keep: tuple[str, ...] = ()  # integer weights the graph dequantizes itself: folding would make them float
    if dequantized:
        assert request.dequantized is not None
        model = request.dequantized
        try:
            own = predict(ort_runner(model, request.threads), request.evaluation)
        except ConversionError as err:
            return Prepared(None, error=f"its float graph does not run: {err}")
        found = request.score(own)
        done.passes.append(PassRecord(name="dequantize", params={
            "from": request.source.quantization.primary,  # type: ignore[union-attr]
            request.plan.name: round(found.value, 6), "sqnr_db": round(found.sqnr_db, 2),
        }))  # fmt: skip
        done.notes.append(f"its float graph scores {request.plan.name} {found.value:.4f} against the model as it "
                          "arrives (each recipe from it is judged against that)")  # fmt: skip
        # The graph passes keep the float graph's own outputs (what they must not move), not the quantized ones.
        request = dataclasses.replace(request, reference=own, ref_value=score(own, own, request.evaluation.labels,
                                                                              request.plan).value)  # fmt: skip
    elif arrives_quantized(request.source):
        keep = request.source.quantization.integer_weights  # type: ignore[union-attr]
    if decompose:
        # Mandatory when asked for (the target cannot load the op), so a failure or a miss of the gate ends here.
        try:
            candidate = custom_ops.decompose(model, custom_ops.DecomposeConfig(decompose))
            result = request.score(predict(ort_runner(candidate, request.threads), request.evaluation))
        except ConversionError as err:
            return Prepared(None, error=f"cannot decompose custom operators: {err}", decomposed=decompose)
        reason = request.gate(result, budget)
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
    if request.pins:
        model = graph.pin_inputs(model, graph.PinConfig(dict(request.pins)))
        done.passes.append(PassRecord(name="pin-inputs", params={k: str(v.tolist()) for k, v in request.pins.items()}))
    if request.user_dims.dims or request.user_dims.shapes:
        model = graph.fix_dims(model, request.user_dims)
        done.passes.append(PassRecord(name="fix-dims", params={k: v for k, v in request.user_dims.dims.items()}))
    if static:
        names = dynamic_inputs(model)
        if names:
            try:
                shapes = shapes_from_data(request, names)
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
        ws.progress(f"converting opset {current} → {wanted}")
        try:
            model = graph.convert_opset(model, graph.OpsetConfig(wanted))
        except ConversionError as err:
            return Prepared(None, done.passes, done.notes, f"opset {current} outside {opset_min}-{opset_max}: {err}")
        done.passes.append(PassRecord(name="convert-opset", params={"from": current, "to": wanted}))
    steps: list[tuple[str, Callable[[onnx.ModelProto], onnx.ModelProto]]] = [
        ("fold-constants", lambda m: graph.fold_constants(m, graph.FoldConfig(keep=keep))),
        ("fuse-conv-bn", graph.fuse_conv_bn),
        ("remove-redundant", graph.remove_redundant),
        ("shape-inference", graph.infer_shapes),
    ]
    with phases.phase("prepare"):
        model = _graph_passes(request, ws, model, steps, budget, done)
    done.model = model
    log.info("prepared model: %s", [p.name for p in done.passes])
    return done


def _gate_reason(request: SearchRequest, model: onnx.ModelProto, budget: Budget) -> tuple[str | None, float]:
    result = request.score(predict(ort_runner(model, request.threads), request.evaluation))
    reason = request.gate(result, budget)
    if reason is None and result.sqnr_db < GRAPH_PASS_MIN_SQNR_DB:
        reason = f"SQNR {result.sqnr_db:.1f} dB under {GRAPH_PASS_MIN_SQNR_DB:.0f} dB for an FP32 graph pass"
    return reason, result.sqnr_db


def _graph_passes(
    request: SearchRequest,
    ws: Workspace,
    model: onnx.ModelProto,
    steps: list[tuple[str, Callable[[onnx.ModelProto], onnx.ModelProto]]],
    budget: Budget,
    done: Prepared,
) -> onnx.ModelProto:
    """The FP32 graph passes, chained and gated once, else one by one. They only make the graph faster, so under
    --time-budget they are cut like a build: not started once the builds' deadline has passed, and stopped at it
    (the graph keeps the steps already gated); not run at all where the budget cut the evaluation set (`ws.lean`:
    a step cannot be stopped while it runs). The graph as it is still makes the FP32 candidates."""
    if ws.lean:  # constant folding alone took 32 s of a 60 s budget for u2netp on a busy machine, uninterruptibly
        done.notes.append("FP32 graph passes not run: the time budget cut the evaluation set (a slow or busy machine)")
        deadline.cut("FP32 graph passes", "not run: the evaluation set was cut, so the machine has no time for them")
        return model
    try:
        with deadline.until(ws.build_deadline, ws.budget_s or 0.0):
            deadline.check()
            chained = _all_steps(request, model, steps, budget, done)
            if chained is not None:
                return chained
            for name, step in steps:  # some step moves the outputs: gate each on its own to find and drop it
                model = _one_step(request, model, name, step, budget, done)
    except deadline.TimeBudgetSpent:
        kept = [p.name for p in done.passes if p.name in {n for n, _ in steps}]
        done.notes.append(f"FP32 graph passes cut by the time budget (kept: {', '.join(kept) or 'none'})")
        deadline.cut("FP32 graph passes", f"stopped at the deadline; kept: {', '.join(kept) or 'none'}")
    return model


def _all_steps(
    request: SearchRequest,
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
        deadline.check()
        try:
            candidate = step(model)
        except ConversionError as err:
            notes.append(f"{name} skipped: {err}")
            continue
        records.append((name, len(model.graph.node), len(candidate.graph.node)))
        model = candidate
    try:
        reason, sqnr = _gate_reason(request, model, budget)
    except deadline.TimeBudgetSpent:
        raise
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
    request: SearchRequest,
    model: onnx.ModelProto,
    name: str,
    step: Callable[[onnx.ModelProto], onnx.ModelProto],
    budget: Budget,
    done: Prepared,
) -> onnx.ModelProto:
    deadline.check()
    try:
        candidate = step(model)
        reason, sqnr = _gate_reason(request, candidate, budget)
    except deadline.TimeBudgetSpent:
        raise
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


def _prepare_large(
    request: SearchRequest, model: onnx.ModelProto, static: bool, decompose: tuple[str, ...]
) -> Prepared:
    """A model over protobuf's limit takes no graph pass (each serializes the whole model): the ones a target
    needs are refused, naming them."""
    dims = request.user_dims
    needed = [
        what
        for what, asked in (
            ("pinned inputs", bool(request.pins)), ("fixed dims", bool(dims.dims or dims.shapes)),
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
