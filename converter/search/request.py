"""What a search is given and where it works.

- `SearchRequest` (frozen): the inputs, loaded and checked once per conversion: the source model and what the
  user fixed in it (pins, dimensions, a torch model for CoreML), the data (calibration and evaluation sets, the
  FP32 reference outputs on the evaluation set, the metric and the FP32 model's own score, the held-out split),
  and the options (threads, custom-op policy). Every stage reads it; none changes it.
- `Workspace`: the working state: the work directory, the build cache, the deadline (`--time-budget`), progress
  messages, and the memo of what was prepared and built (shared by the profiles of one conversion).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from edgefleet.converter.model import SourceModel
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import transformer
from edgefleet.converter.passes.graph import FixDimsConfig
from edgefleet.converter.passes.openvino import OpenVINOArtifact
from edgefleet.converter.passes.transformer import Encoder
from edgefleet.converter.quantized import dequantize
from edgefleet.converter.search.cache import BuildCache
from edgefleet.converter.search.gate import Budget, MetricPlan, Score, gate, score
from edgefleet.converter.search.holdout import Part, Split, make_part, split_indices
from edgefleet.converter.search.types import Built, Prepared
from edgefleet.core.bundle.manifest import CustomOp, PassRecord, TensorSpec
from edgefleet.core.tensors import Dataset

Progress = Callable[[str], None]


def quiet(_message: str) -> None:
    """A progress callback that says nothing."""


def arrives_quantized(source: SourceModel) -> bool:
    """Integer-quantized as given (float16 weights alone are a float model here: its recipes apply)."""
    arrived = source.quantization
    return arrived is not None and arrived.kinds != ("fp16",)


@dataclass(frozen=True)
class SearchRequest:
    # the model
    source: SourceModel
    outputs: tuple[TensorSpec, ...]  # its outputs' signature as a real run returns them (the bundle's)
    pins: Mapping[str, np.ndarray]
    user_dims: FixDimsConfig
    custom_ops: tuple[CustomOp, ...]  # the source's custom operators (converter.passes.custom_ops)
    torch_model: Path | None  # the user's torch model for CoreML, instead of onnx2torch's conversion
    # the data
    calib: Dataset  # keyed by the inputs that remain after pinning
    evaluation: Dataset
    reference: Mapping[str, np.ndarray]  # FP32 source outputs on the evaluation set
    plan: MetricPlan
    ref_value: float  # the FP32 model's own score under `plan`
    data_sha: Mapping[str, str]  # the data files' hashes, for the build cache's keys
    split: Split  # the evaluation set split for mixed precision (converter.search.holdout)
    selection: Part | None
    held_out: Part | None
    warnings: tuple[str, ...] = ()  # what the report says of the model as given (a declared shape corrected)
    # the options
    threads: int = 1
    custom_op_policy: cops.Policy = "decompose"
    # a model that arrives quantized (converter.quantized): its float graph, where it has one, and whether
    # OpenVINO's converter takes its com.microsoft operators (None: it has none)
    dequantized: onnx.ModelProto | None = None
    openvino_converts: bool | None = None
    # a transformer encoder's blocks (converter.passes.transformer): it gets the transformer recipes
    encoder: Encoder | None = None

    @classmethod
    def of(
        cls,
        source: SourceModel,
        *,
        calib: Dataset,
        evaluation: Dataset,
        reference: Mapping[str, np.ndarray],
        plan: MetricPlan,
        data_sha: Mapping[str, str],
        pins: Mapping[str, np.ndarray] | None = None,
        user_dims: FixDimsConfig | None = None,
        torch_model: Path | None = None,
        threads: int = 1,
        custom_op_policy: cops.Policy = "decompose",
        outputs: list[TensorSpec] | None = None,
        warnings: list[str] | None = None,
    ) -> SearchRequest:
        """The request with what follows from its inputs: the FP32 score, custom operators, the held-out split."""
        reference = dict(reference)
        split = split_indices(len(evaluation))
        parts: dict[str, Part | None] = {"selection": None, "held-out": None}
        if not split.refused:
            for name, indices in (("selection", split.selection), ("held-out", split.held_out)):
                parts[name] = make_part(name, indices, evaluation, reference, plan)  # type: ignore[arg-type]
        return cls(
            source=source,
            outputs=tuple(outputs if outputs is not None else source.outputs),
            warnings=tuple(warnings or ()),
            pins=dict(pins or {}),
            user_dims=user_dims or FixDimsConfig(),
            custom_ops=tuple(cops.custom_ops(source.proto)),
            torch_model=torch_model,
            calib=calib,
            evaluation=evaluation,
            reference=reference,
            plan=plan,
            ref_value=score(reference, reference, evaluation.labels, plan).value,
            data_sha=dict(data_sha),
            split=split,
            selection=parts["selection"],
            held_out=parts["held-out"],
            threads=threads,
            custom_op_policy=custom_op_policy,
            dequantized=dequantize(source.proto)
            if arrives_quantized(source) and source.quantization.dequantizable and not source.large  # type: ignore[union-attr]
            else None,
            openvino_converts=_openvino_converts(source.proto) if arrives_quantized(source) and any(
                op.domain == "com.microsoft" for op in cops.custom_ops(source.proto)) else None,
            encoder=None if arrives_quantized(source) or source.large else transformer.encoder(source.proto),
        )  # fmt: skip

    @property
    def output_names(self) -> list[str]:
        return list(self.reference)

    def part(self, name: Literal["selection", "held-out"]) -> Part:
        found = self.selection if name == "selection" else self.held_out
        assert found is not None, self.split.refused
        return found

    def score(self, outputs: Mapping[str, np.ndarray]) -> Score:
        return score(outputs, self.reference, self.evaluation.labels, self.plan)

    def gate(self, result: Score, budget: Budget) -> str | None:
        return gate(result, self.ref_value, budget)


def _openvino_converts(model: onnx.ModelProto) -> bool:
    """Whether OpenVINO's ONNX front end converts the model (it takes some com.microsoft operators: MatMulNBits,
    QLinear*, but not others)."""
    from edgefleet.converter.passes.openvino import OpenVINOConfig, export_openvino
    from edgefleet.core.errors import ConversionError

    try:
        export_openvino(model, OpenVINOConfig(None))
    except ConversionError:
        return False
    return True


TIMING_RESERVE_S = 10.0  # kept from --time-budget for the timing rounds and the bundle
FINISH_S = 2.0  # ... of which the bundle's share (golden set, peak-memory probe, signing), until a build sizes it


@dataclass
class Memo:
    """What one conversion prepared and built, by key, so its profiles share the work."""

    prepared: dict[str, Prepared] = field(default_factory=dict)
    builds: dict[str, Built] = field(default_factory=dict)
    openvino: dict[int, tuple[onnx.ModelProto, OpenVINOArtifact]] = field(default_factory=dict)
    nncf_mixed: dict[str, tuple[OpenVINOArtifact, PassRecord, str]] = field(default_factory=dict)
    ranked: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)


@dataclass
class Workspace:
    work: Path
    cache: BuildCache | None = None
    deadline: float | None = None  # time.monotonic() by which this profile's search should be done (--time-budget)
    budget_s: float | None = None  # --time-budget, for what the report and the stopped builds say
    progress: Progress = quiet
    memo: Memo = field(default_factory=Memo)
    reserve_s: float = TIMING_RESERVE_S  # kept from the deadline for the timing rounds and the bundle
    finish_s: float = FINISH_S  # kept from the deadline by the timing for the bundle (converter.search.attempts)
    # The time budget cut the evaluation set (the machine is too slow or busy for it): optional FP32 work, the graph
    # passes, is cut too (converter.search.prepare).
    lean: bool = False

    @property
    def statistics(self) -> Path:
        """Where the quantizers' calibration statistics are kept for this conversion, shared by its candidates."""
        return self.work / "calibration"

    @property
    def build_deadline(self) -> float | None:
        """When builds must stop (converter.deadline), the timing reserve kept."""
        return None if self.deadline is None else self.deadline - self.reserve_s

    def out_of_time(self) -> bool:
        """Whether builds are past their deadline."""
        return self.spent()

    def spent(self, need_s: float = 0.0) -> bool:
        """Whether the build deadline leaves less than `need_s` for another build."""
        stop = self.build_deadline
        return stop is not None and time.monotonic() + need_s > stop
