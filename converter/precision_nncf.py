"""The accuracy-controlled NNCF recipe inside a conversion: NNCF's validation is the conversion's own task metric
on the selection part of the evaluation set against the FP32 reference, and its bar is the conversion's bar on
that part (converter.precision_holdout).

NNCF bounds an absolute drop below the FP32 model as *it* scores it (OpenVINO f32, averaged per sample), so the
drop handed to it is that score minus the bar; the converter then judges the result on the held-out part,
which NNCF never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefleet.converter.context import Context
from edgefleet.converter.metrics import Metric
from edgefleet.converter.passes import nncf_accuracy as nac
from edgefleet.converter.passes.openvino import OpenVINOArtifact
from edgefleet.converter.precision_holdout import part
from edgefleet.core.errors import ConversionError
from edgefleet.core.manifest import PassRecord
from edgefleet.core.tensors import Dataset


@dataclass(frozen=True)
class MixedNNCFConfig:
    """What the recipe asks of NNCF. `metric` and `bar` are part of the build's cache key."""

    metric: str
    bar: float  # the task score the result must reach (on the selection part)
    selection_samples: int = 0  # evaluation samples NNCF validates on (the selection part)
    preset: str = "performance"
    ranking_subset_size: int = 8  # NNCF compiles one model per quantizer group to rank them: keep this small
    max_layers: int | None = 16  # at most this many groups put back into float

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {
            "metric": self.metric,
            "bar": self.bar,
            "selection_samples": self.selection_samples,
            "preset": self.preset,
            "ranking_subset_size": self.ranking_subset_size,
            "max_layers": self.max_layers,
        }


def quantize_mixed(
    ctx: Context, artifact: OpenVINOArtifact, config: MixedNNCFConfig, source_key: str
) -> tuple[OpenVINOArtifact, PassRecord, str]:
    """The accuracy-controlled INT8 model, the pass record naming its float layers, and a note for the report.

    Done once per source graph (`source_key`: the prepared model's hash) and config: the variants that differ only
    in the inference precision hint share it. NNCF validates on the selection part of the evaluation set only."""
    key = f"nncf-accuracy:{source_key}:{config!r}"
    if key not in ctx.memo:
        selection = part(ctx, "selection")
        ctx.memo[key] = quantize_to_bar(
            artifact, config, ctx.calib, selection.evaluation, selection.reference, ctx.plan.metric
        )
    done: tuple[OpenVINOArtifact, PassRecord, str] = ctx.memo[key]
    model, record, note = done
    # A clone each: the variants set their own precision hint on the model they are saved from.
    return OpenVINOArtifact(model.model.clone(), artifact.inference_precision_hint, False), record, note


def quantize_to_bar(
    artifact: OpenVINOArtifact,
    config: MixedNNCFConfig,
    calibration: Dataset,
    evaluation: Dataset,
    reference: nac.Outputs,
    metric: Metric,
) -> tuple[OpenVINOArtifact, PassRecord, str]:
    """NNCF INT8 with accuracy control, its bar the task metric's `config.bar` on `evaluation`."""
    labels = evaluation.labels

    def task_score(index: int, want: nac.Outputs, got: nac.Outputs) -> float:
        sliced = labels[index : index + 1] if labels is not None else None
        return metric(want, got, sliced)

    initial = _fp32_score(artifact, evaluation, reference, task_score)
    if initial < config.bar:
        raise ConversionError(
            f"OpenVINO's f32 run of the FP32 model scores {config.metric} {initial:.4f} per sample, under the bar "
            f"{config.bar:.4f}: nothing for accuracy control to recover"
        )
    nncf_config = nac.AccuracyControlConfig(
        max_drop=initial - config.bar,
        preset="mixed" if config.preset == "mixed" else "performance",
        ranking_subset_size=config.ranking_subset_size,
        max_layers=config.max_layers,
    )
    done = nac.quantize_with_accuracy_control(artifact, nncf_config, calibration, evaluation, reference, task_score)
    params = config.params() | {
        "fp32_score_per_sample": round(initial, 6),
        "max_drop_given_to_nncf": round(initial - config.bar, 6),
        "quantized_ops": done.quantized_ops,
        "float_layers": list(done.float_layers),
    }
    shown = ", ".join(done.float_layers[:8]) + (" ..." if len(done.float_layers) > 8 else "")
    note = (
        f"NNCF accuracy control kept {len(done.float_layers)} of {done.quantized_ops or '?'} quantized operations "
        f"in float: {shown}"
        if done.float_layers
        else "NNCF accuracy control kept every layer in INT8"
    )
    return done.artifact, PassRecord(name="nncf-int8-accuracy-control", params=params), note


def _fp32_score(
    artifact: OpenVINOArtifact, evaluation: Dataset, reference: nac.Outputs, task_score: nac.IndexedScore
) -> float:
    """The FP32 model's per-sample mean task score as NNCF computes it (OpenVINO, f32 inference precision)."""
    import openvino as ov

    compiled = ov.Core().compile_model(artifact.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    items = ((i, {k: np.asarray(v) for k, v in evaluation.sample(i).items()}) for i in range(len(evaluation)))
    scores = nac.sample_scores(compiled, items, reference, task_score)
    return float(np.mean(scores)) if scores else 0.0
