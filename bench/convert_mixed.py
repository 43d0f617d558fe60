"""Mixed-precision rows of bench/convert.py: where a plain INT8 recipe misses the task bar, the same INT8 with only
the layers that cost the score kept in float, built by edgefleet's passes and timed with the other recipes.

- "mixed: OV+NNCF accuracy control": nncf.quantize_with_accuracy_control driven by the task metric against the
  FP32 reference at the task's bar (converter/mixed/nncf.py), float layers at f32 and, where the CPU computes
  bf16 natively, at bf16.
- "mixed: ORT INT8 static, exclusion search": U8S8 per-channel QDQ with its worst layers by local error in float
  (converter/passes/quantize_local.py), the float set grown 1, 2, 4, ... and bisected
  (converter/mixed/float_set.py). Both mixed rows select and are scored on the bench's whole evaluation set (the
  converter itself judges them on a held-out split: converter/mixed/holdout.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.heads import PLUMBING
from edgefleet.converter.passes.nncf_accuracy import MixedNNCFConfig, quantize_to_bar
from edgefleet.converter.passes.quantize_local import local_report
from edgefleet.converter.runners import Runner, openvino_runner, ort_runner, predict
from edgefleet.converter.search.gate import MetricPlan, score
from edgefleet.converter.search.mixed.float_set import search_float_set
from edgefleet.converter.search.plan import bf16_native
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

Built = dict[str, Any]  # recipe name → (runner, size bytes, graph, OpenVINO hint) or the error that stopped it


def mixed_recipes(
    proto: onnx.ModelProto,
    calib: Dataset,
    evaluation: Dataset,
    reference: Mapping[str, np.ndarray],
    plan: MetricPlan,
    bar: float,
    threads: int,
    misses: Callable[[str], bool],
    log: Callable[[str], None],
) -> tuple[Built, list[str]]:
    """Mixed rows for the plain INT8 recipes that `misses` the bar, and notes naming what each kept in float."""
    built: Built = {}
    notes: list[str] = []
    names = list(reference)
    if misses("OpenVINO+NNCF INT8"):
        log("mixed: NNCF accuracy control driven by the task metric")
        try:
            art, _record, note = quantize_to_bar(
                ovp.export_openvino(proto, ovp.OpenVINOConfig(None)), MixedNNCFConfig(plan.name, bar), calib,
                evaluation, dict(reference), plan.metric,
            )  # fmt: skip
        except ConversionError as err:
            built["mixed: OV+NNCF accuracy control"] = err
        else:
            notes.append(f"OV+NNCF accuracy control: {note}")
            size = _ir_size(art)
            hints = ["f32", "bf16"] if bf16_native("CPU") else ["f32"]
            for hint in hints:
                runner = openvino_runner(ovp.OpenVINOArtifact(art.model, hint, False), names, threads)
                built[f"mixed: OV+NNCF accuracy control ({hint})"] = (runner, size, art.model, hint)
    if misses("ORT INT8 static (defaults)"):
        log("mixed: ORT INT8 static, exclusion search")
        try:
            built.update(_ort_exclusion(proto, calib, evaluation, reference, plan, bar, threads, notes))
        except ConversionError as err:
            built["mixed: ORT INT8 static, exclusion search"] = err
    return built, notes


def _ir_size(art: ovp.OpenVINOArtifact) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        return sum(f.stat().st_size for f in art.save(Path(tmp) / "m.xml"))


def _ort_exclusion(
    proto: onnx.ModelProto,
    calib: Dataset,
    evaluation: Dataset,
    reference: Mapping[str, np.ndarray],
    plan: MetricPlan,
    bar: float,
    threads: int,
    notes: list[str],
) -> Built:
    config = prec.StaticConfig()
    plain = prec.quantize_int8_static(proto, config, calib)
    try:  # the converter's ranking: local error, each layer the nodes that keep its inputs in float
        ranked = list(dict.fromkeys(w.group for w in local_report(proto, plain, calib, samples=8)))[:64]
    except ConversionError:
        layers = prec.layer_report(proto, plain, calib)
        ranked = [(w.node,) for w in layers.worst(len(layers.layers)) if w.node and w.op_type not in PLUMBING][:64]
        ranked = list(dict.fromkeys(ranked))

    def try_count(count: int) -> tuple[tuple[Runner, int, onnx.ModelProto, None], bool]:
        names = tuple(dict.fromkeys(n for layer in ranked[:count] for n in layer))
        model = prec.quantize_int8_static(proto, prec.StaticConfig(exclude_nodes=names), calib)
        runner = ort_runner(model, threads)
        value = score(predict(runner, evaluation), reference, evaluation.labels, plan).value
        return (runner, len(model.SerializeToString()), model, None), value >= bar - 1e-12

    found = search_float_set(len(ranked), try_count)
    tried = ", ".join(f"{t.count}: {'meets' if t.passed else 'misses'}" for t in found.trials)
    notes.append(f"ORT exclusion search over {len(ranked)} ranked layers, {len(found.trials)} builds ({tried})")
    if found.best is None:
        raise ConversionError(f"no float set of the {len(ranked)} ranked layers met the bar")
    return {f"mixed: ORT INT8 static, {found.best.count} of {len(ranked)} layers float": found.best.result}
