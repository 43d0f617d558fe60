"""NNCF INT8 with accuracy control: quantize, then put back into float the layers that cost the task score most,
until the score is inside the bar (nncf.quantize_with_accuracy_control, driven by the caller's task metric).

The validation function NNCF calls scores a compiled model's outputs on the evaluation set against the FP32
reference outputs with the task metric (per sample, so NNCF can rank layers by how much each costs). NNCF
compiles candidates with f32 inference precision; the layers it reverts are read from its own report.
openvino and nncf are imported inside the function so that listing passes never needs them.

`quantize_to_bar` is the recipe the search builds (MixedNNCFConfig): the bar in the task metric's own terms,
turned into the absolute drop NNCF bounds, below the FP32 model's score as NNCF computes it (OpenVINO f32,
averaged per sample).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edgefleet.converter import deadline
from edgefleet.converter.metrics import Metric
from edgefleet.converter.passes.openvino import OpenVINOArtifact, _first_line, checked
from edgefleet.core.bundle.manifest import PassRecord
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

log = logging.getLogger(__name__)

Outputs = Mapping[str, np.ndarray]
# (sample index, reference outputs, candidate outputs of that one sample) → score, higher is better
IndexedScore = Callable[[int, Outputs, Outputs], float]
_REVERTED = re.compile(r"(\d+) out of (\d+) were reverted back to the floating-point precision:\n?(.*)", re.S)


@dataclass(frozen=True)
class AccuracyControlConfig:
    max_drop: float  # largest drop of the task score below the FP32 model's, in the metric's units
    preset: Literal["performance", "mixed"] = "performance"
    subset_size: int = 300
    ranking_subset_size: int = 16  # samples NNCF scores each reverted group on while ranking
    max_layers: int | None = None  # at most this many groups put back into float (None: NNCF's default, all)
    fast_bias_correction: bool = True

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {
            "max_drop": self.max_drop,
            "preset": self.preset,
            "subset_size": self.subset_size,
            "ranking_subset_size": self.ranking_subset_size,
            "max_layers": self.max_layers,
        }


@dataclass(frozen=True)
class AccuracyControlled:
    artifact: OpenVINOArtifact
    float_layers: tuple[str, ...]  # operations NNCF put back into float, in the order it reverted them
    quantized_ops: int  # quantized operations of the plain INT8 model


def quantize_with_accuracy_control(
    artifact: OpenVINOArtifact,
    config: AccuracyControlConfig,
    calibration: Dataset,
    evaluation: Dataset,
    reference: Outputs,
    task_score: IndexedScore,
) -> AccuracyControlled:
    """NNCF INT8 on the OpenVINO model with as few layers in float as keep `task_score` within `max_drop`
    of the FP32 model's (the model passed in is cloned, never changed)."""
    import nncf

    calib = [
        {k: np.asarray(v) for k, v in calibration.sample(i).items()}
        for i in range(min(config.subset_size, len(calibration)))
    ]
    items = [(i, {k: np.asarray(v) for k, v in evaluation.sample(i).items()}) for i in range(len(evaluation))]

    def validate(compiled: Any, data: Iterable[tuple[int, dict[str, np.ndarray]]]) -> tuple[float, list[float]]:
        deadline.check()  # NNCF validates after each compile: ranking, then each layer it reverts
        per_item = sample_scores(compiled, data, reference, task_score)
        return float(np.mean(per_item)) if per_item else 0.0, per_item

    preset = nncf.QuantizationPreset.MIXED if config.preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE
    restorer = nncf.AdvancedAccuracyRestorerParameters(
        ranking_subset_size=min(config.ranking_subset_size, len(items)),
        num_ranking_workers=1,  # NNCF's parallel ranking compiles a model per worker: memory for nothing on 2 cores
        **({"max_num_iterations": config.max_layers} if config.max_layers is not None else {}),
    )
    capture = _ReportCapture()
    nncf_log = logging.getLogger("nncf")
    handlers, nncf_log.handlers = nncf_log.handlers, [capture]  # its report is read, not printed
    nncf.set_log_level(logging.INFO)
    try:
        # NNCF draws progress bars on stdout, which would corrupt `--json` output: send them elsewhere.
        with contextlib.redirect_stdout(io.StringIO()):
            model = nncf.quantize_with_accuracy_control(
                artifact.model.clone(),
                nncf.Dataset(calib, checked),
                nncf.Dataset(items, lambda item: checked(item[1])),
                validate,
                max_drop=config.max_drop,
                drop_type=nncf.DropType.ABSOLUTE,
                preset=preset,
                subset_size=len(calib),
                fast_bias_correction=config.fast_bias_correction,
                advanced_accuracy_restorer_parameters=restorer,
            )
    except deadline.TimeBudgetSpent:
        raise
    except Exception as err:  # NNCF raises its own errors and whatever OpenVINO raises
        raise ConversionError(f"NNCF accuracy-controlled INT8 failed: {_first_line(err)}") from err
    finally:
        nncf_log.handlers = handlers
        nncf.set_log_level(logging.ERROR)
    reverted, total = capture.reverted()
    return AccuracyControlled(OpenVINOArtifact(model, artifact.inference_precision_hint, False), reverted, total)


def sample_scores(
    compiled: Any, data: Iterable[tuple[int, dict[str, np.ndarray]]], reference: Outputs, task_score: IndexedScore
) -> list[float]:
    """The task score of each (index, inputs) sample run through an OpenVINO compiled model."""
    names = list(reference)
    scores = []
    for index, feeds in data:
        result = compiled(feeds)
        want = {name: reference[name][index : index + 1] for name in names}
        got = {name: np.asarray(result[compiled.outputs[j]]) for j, name in enumerate(names)}
        got = {n: v if v.shape == want[n].shape else v.reshape(want[n].shape) for n, v in got.items()}
        scores.append(float(task_score(index, want, got)))
    return scores


class _ReportCapture(logging.Handler):
    """Keeps NNCF's final report: how many operations it reverted to float, and which."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def reverted(self) -> tuple[tuple[str, ...], int]:
        for message in reversed(self.messages):
            found = _REVERTED.search(message)
            if found:
                layers = tuple(line.strip() for line in found.group(3).splitlines() if line.strip())
                return layers, int(found.group(2))
        return (), 0  # NNCF met the bar with every layer quantized: it printed no report


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


def quantize_to_bar(
    artifact: OpenVINOArtifact,
    config: MixedNNCFConfig,
    calibration: Dataset,
    evaluation: Dataset,
    reference: Outputs,
    metric: Metric,
) -> tuple[OpenVINOArtifact, PassRecord, str]:
    """NNCF INT8 with accuracy control, its bar the task metric's `config.bar` on `evaluation`."""
    labels = evaluation.labels

    def task_score(index: int, want: Outputs, got: Outputs) -> float:
        sliced = labels[index : index + 1] if labels is not None else None
        return metric(want, got, sliced)

    initial = _fp32_score(artifact, evaluation, reference, task_score)
    if initial < config.bar:
        raise ConversionError(
            f"OpenVINO's f32 run of the FP32 model scores {config.metric} {initial:.4f} per sample, under the bar "
            f"{config.bar:.4f}: nothing for accuracy control to recover"
        )
    nncf_config = AccuracyControlConfig(
        max_drop=initial - config.bar,
        preset="mixed" if config.preset == "mixed" else "performance",
        ranking_subset_size=config.ranking_subset_size,
        max_layers=config.max_layers,
    )
    done = quantize_with_accuracy_control(artifact, nncf_config, calibration, evaluation, reference, task_score)
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


def _fp32_score(artifact: OpenVINOArtifact, evaluation: Dataset, reference: Outputs, task_score: IndexedScore) -> float:
    """The FP32 model's per-sample mean task score as NNCF computes it (OpenVINO, f32 inference precision)."""
    import openvino as ov

    compiled = ov.Core().compile_model(artifact.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    items = ((i, {k: np.asarray(v) for k, v in evaluation.sample(i).items()}) for i in range(len(evaluation)))
    scores = sample_scores(compiled, items, reference, task_score)
    return float(np.mean(scores)) if scores else 0.0
