"""Mixed precision for a quantized candidate that misses the task bar: keep only the layers that cost the score
in float, and keep the fastest variant that meets the bar.

- OpenVINO: NNCF's quantize_with_accuracy_control driven by the task metric (converter.passes.nncf_accuracy), with the
  float layers at bf16 inference precision first where the CPU computes bf16 natively and the target lists
  bf16, then at the target's own hint.
- ONNX Runtime: layers ranked by their local error (converter.passes.quantize_local, worst SQNR first; each
  layer the group of nodes that keeps its inputs in float), the float set grown and then bisected
  (converter.search.mixed.float_set), each count one build confirmed by the task metric.

Both choose on the selection part of the evaluation set and the variant they settle on is judged once, on the
held-out part (converter.search.holdout); with too few evaluation samples to split, neither is tried.
Every build is yielded for the report; the search's caller stops at the first that meets the bar, so the
variants that met it with more layers in float are noted, not yielded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

import onnx

from edgefleet.converter import deadline, phases
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.heads import PLUMBING
from edgefleet.converter.passes.nncf_accuracy import MixedNNCFConfig
from edgefleet.converter.passes.quantize_local import local_report
from edgefleet.converter.search.build import build
from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.holdout import on_held_out, on_selection
from edgefleet.converter.search.mixed.float_set import search_float_set
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.search.types import Built, Prepared
from edgefleet.core.errors import ConversionError

MAX_RANKED = 64  # layers the ORT exclusion search may put back into float
Reports = dict[str, list[dict[str, object]]]  # the report's worst layers, by prepared model
RANK_SAMPLES = 8  # calibration samples the per-layer ranking runs (qdq_loss_debug holds every activation of each)


def mixed_attempts(
    request: SearchRequest,
    ws: Workspace,
    prepared: Prepared,
    first: Built,
    base: str,
    budget: Budget,
    notes: list[str],
    layer_reports: dict[str, list[dict[str, object]]],
    bf16: bool,
) -> Iterator[Built]:
    """Mixed-precision variants of `first` (a quantized candidate that missed the bar), failing ones first."""
    if first.spec.kind not in ("ov-nncf", "ort-int8-static"):
        return
    split = request.split
    if split.refused:
        notes.append(f"{first.spec.name}: {split.refused}")
        return
    notes.append(f"{first.spec.name}: mixed precision chooses its float layers on the selection split and is "
                 f"judged on the held-out split: {split.describe()}")  # fmt: skip
    if first.spec.kind == "ov-nncf":
        yield from _nncf(request, ws, prepared, first, base, budget, notes, bf16)
    elif first.spec.kind == "ort-int8-static":
        yield from _ort(request, ws, prepared, first, base, budget, notes, layer_reports)


def _nncf(
    request: SearchRequest,
    ws: Workspace,
    prepared: Prepared,
    first: Built,
    base: str,
    budget: Budget,
    notes: list[str],
    bf16: bool,
) -> Iterator[Built]:
    selection = request.part("selection")
    config = MixedNNCFConfig(metric=request.plan.name, bar=budget.floor(request.plan.name, selection.ref_value),
                             selection_samples=len(selection.indices))  # fmt: skip
    hints = (["bf16"] if bf16 and first.spec.hint != "bf16" else []) + [first.spec.hint]
    for hint in hints:
        suffix = "-bf16" if hint == "bf16" else ""
        spec = replace(first.spec, name=f"{base}-int8-nncf-accuracy{suffix}", kind="ov-nncf-accuracy", config=config,
                       hint=hint)  # fmt: skip
        ws.progress(f"NNCF accuracy control: INT8 with the layers that cost {request.plan.name} in float"
                     + (" (bf16)" if suffix else ""))  # fmt: skip
        built, passed = on_selection(build(request, ws, prepared, spec, budget), selection, request.plan, budget)
        if passed:  # the variant NNCF's selection settled on: judged once, held out, whatever the verdict
            yield _held_out(request, built, budget, notes)
            return
        yield built
        if ws.out_of_time():
            return


def _ort(
    request: SearchRequest,
    ws: Workspace,
    prepared: Prepared,
    first: Built,
    base: str,
    budget: Budget,
    notes: list[str],
    layer_reports: dict[str, list[dict[str, object]]],
) -> Iterator[Built]:
    assert isinstance(first.spec.config, prec.StaticConfig)
    config = first.spec.config
    ranked = ranked_layers(request, ws, prepared, first, notes, layer_reports)
    selection = request.part("selection")
    if not ranked:
        return

    def try_count(count: int) -> tuple[Built, bool]:
        names = tuple(dict.fromkeys(name for layer in ranked[:count] for name in layer))
        spec = replace(first.spec, name=f"{base}-int8-static-float{count}",
                       config=dataclasses.replace(config, exclude_nodes=names))  # fmt: skip
        ws.progress(f"INT8 with the {count} worst of {len(ranked)} ranked layers in float ({len(names)} nodes)")
        return on_selection(build(request, ws, prepared, spec, budget), selection, request.plan, budget)

    found = search_float_set(len(ranked), try_count, ws.out_of_time)
    tried = ", ".join(f"{t.count}: {'meets' if t.passed else 'misses'}" for t in found.trials)
    tried += " on the selection split"
    notes.append(f"ORT exclusion search over {len(ranked)} ranked layers, {len(found.trials)} builds ({tried})"
                 + (f"; {found.stopped}" if found.stopped else ""))  # fmt: skip
    for trial in found.failed:
        if trial.passed:
            best = found.best.result.spec.name  # type: ignore[union-attr]
            notes.append(f"{trial.result.spec.name}: met the bar on the selection split; dropped for {best} "
                         "(fewer layers in float)")  # fmt: skip
        else:
            yield trial.result
    if found.best is not None:  # the smallest float set that met the bar on the selection split, judged held out
        yield _held_out(request, found.best.result, budget, notes)


def _held_out(request: SearchRequest, selected: Built, budget: Budget, notes: list[str]) -> Built:
    """The variant a search settled on, judged on the held-out split; the report's notes say how it fared."""
    held_out, selection = request.part("held-out"), request.part("selection")
    judged = on_held_out(selected, held_out, selection, request.plan, budget)
    if judged.judged is not None and judged.score is not None:
        verdict = "meets the bar" if judged.gate is None else "misses the bar: refused"
        notes.append(f"{judged.spec.name}: {request.plan.name} {judged.score.value:.4f} on the "
                     f"{judged.judged.describe()}; {verdict}")  # fmt: skip
    return judged


def ranked_layers(
    request: SearchRequest, ws: Workspace, prepared: Prepared, first: Built, notes: list[str], layer_reports: Reports
) -> list[tuple[str, ...]]:
    """Quantized layers worst first by their local error (converter.passes.quantize_local: each node run on the
    float model's inputs, so an early layer that breaks ranks first, not the downstream layers it disturbs),
    each as the node names ONNX Runtime must exclude to take its inputs out of INT8. Where the local report
    cannot be made, qdq_loss_debug's accumulated error ranks them instead (each layer its own node)."""
    key = f"{prepared.sha}:{first.spec.name}"
    if key not in ws.memo.ranked:
        assert prepared.model is not None
        try:
            config = first.spec.config
            assert isinstance(config, prec.StaticConfig)
            qdq = first.qdq_model or prec.quantize_int8_static(prepared.model, config, request.calib, ws.statistics)
        except ConversionError as err:
            notes.append(f"per-layer report unavailable: {err}")
            ws.memo.ranked[key] = []
        else:
            ws.memo.ranked[key] = _rank_local(request, prepared, qdq, notes, layer_reports)
    return ws.memo.ranked[key]


def _rank_local(
    request: SearchRequest, prepared: Prepared, qdq: onnx.ModelProto, notes: list[str], reports: Reports
) -> list[tuple[str, ...]]:
    assert prepared.model is not None
    try:
        with phases.phase("layer-report"):  # a ranking, not a gate: a few samples order the layers
            local = local_report(prepared.model, qdq, request.calib, samples=RANK_SAMPLES)[:MAX_RANKED]
    except deadline.TimeBudgetSpent as err:
        notes.append(f"per-layer ranking {err}")
        return []
    except ConversionError as err:
        notes.append(f"local per-layer report unavailable ({err}): ranked by accumulated error instead")
        return _rank_accumulated(request, prepared, qdq, notes, reports)
    reports[prepared.sha[:12]] = [
        {"node": w.node, "op_type": w.op_type, "local_sqnr_db": round(w.sqnr_db, 2), "float_group": list(w.group)}
        for w in local
    ]
    notes.append(
        "quantized layers with the worst local error (SQNR dB, on float inputs): "
        + ", ".join(f"{w.node} {w.sqnr_db:.1f}" for w in local[:5])
    )
    return list(dict.fromkeys(w.group for w in local))


def _rank_accumulated(
    request: SearchRequest, prepared: Prepared, qdq: onnx.ModelProto, notes: list[str], reports: Reports
) -> list[tuple[str, ...]]:
    """qdq_loss_debug's ranking: each activation's error against the float model's, accumulated from upstream."""
    assert prepared.model is not None
    try:
        with phases.phase("layer-report"):
            report = prec.layer_report(prepared.model, qdq, request.calib, samples=RANK_SAMPLES)
    except ConversionError as err:
        notes.append(f"per-layer report unavailable: {err}")
        return []
    # Shape plumbing (Reshape, Transpose, ...) only carries its input's quantization: rank compute layers.
    worst = [w for w in report.worst(len(report.layers)) if w.node and w.op_type not in PLUMBING][:MAX_RANKED]
    reports[prepared.sha[:12]] = [
        {"node": w.node, "op_type": w.op_type, "tensor": w.tensor, "sqnr_db": round(w.sqnr_db, 2)} for w in worst
    ]
    notes.append("worst quantized layers (SQNR dB): " + ", ".join(f"{w.node} {w.sqnr_db:.1f}" for w in worst[:5]))
    return list(dict.fromkeys((w.node,) for w in worst))
