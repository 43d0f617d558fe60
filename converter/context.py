"""What one conversion shares across profiles: the source, the data, the FP32 reference, caches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.accuracy import Budget, MetricPlan, Score, gate, score
from edgefleet.converter.cache import BuildCache
from edgefleet.converter.model import SourceModel
from edgefleet.converter.passes.custom_ops import Policy
from edgefleet.converter.passes.graph import FixDimsConfig
from edgefleet.core.tensors import Dataset

Progress = Callable[[str], None]


@dataclass
class Context:
    source: SourceModel
    pins: dict[str, np.ndarray]
    user_dims: FixDimsConfig
    calib: Dataset  # keyed by the inputs that remain after pinning
    evaluation: Dataset
    reference: dict[str, np.ndarray]  # FP32 source outputs on the evaluation set
    plan: MetricPlan
    ref_value: float
    data_sha: dict[str, str]
    threads: int
    work: Path
    cache: BuildCache | None
    progress: Progress
    memo: dict[str, Any] = field(default_factory=dict)  # prepared models and built candidates, by key
    custom_op_policy: Policy = "decompose"  # converter.passes.custom_ops: where custom ops are decomposed
    torch_model: Path | None = None  # the user's torch model for CoreML, instead of onnx2torch's conversion
    deadline: float | None = None  # time.monotonic() after which the search builds no more retries

    def out_of_time(self) -> bool:
        import time

        return self.deadline is not None and time.monotonic() > self.deadline

    def score(self, outputs: dict[str, np.ndarray]) -> Score:
        return score(outputs, self.reference, self.evaluation.labels, self.plan)

    def gate(self, result: Score, budget: Budget) -> str | None:
        return gate(result, self.ref_value, budget)
