"""The bundle's task rule on the device: the metric and bar the converter chose the recipe by (the manifest's
`search`), re-computed on the golden set without anything the device lacks.

The device scores its own outputs on the golden inputs against the FP32 reference outputs with the same metric
(edgefleet/core/quality/task_metrics.py), and labels where the golden set holds them (top-1 and top-k). The bar follows
the manifest: an absolute `min_score`, the SQNR floor, or a largest drop below the FP32 model's own score on the
same golden samples. The golden set is a subset of the evaluation data, so when the build's own outputs already
score below the bar there (a few unlucky samples), the floor is what the build scored there, one sample's worth
lower; the check then still catches a device that does worse than the build it was given.

A metric a device cannot compute (a user's `file.py:function`, whose code is not shipped) is named, and the
per-output checks judge alone, as for manifests that predate the recorded metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.core.bundle.manifest import SearchReport
from edgefleet.core.messages import GoldenTask
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.task_metrics import device_metric

_SQNR_SLACK_DB = 1.0


@dataclass(frozen=True)
class TaskVerdict:
    metric: str
    computable: bool
    passed: bool = True
    score: float = float("nan")
    floor: float = float("nan")
    why: str = ""  # computable: how the floor came about; else: why the metric cannot be computed here

    def message(self) -> GoldenTask:
        """What telemetry carries: the metric, and its score and floor where the device computed them."""

        def finite(value: float) -> float | None:
            return round(value, 6) if self.computable and np.isfinite(value) else None

        return GoldenTask(metric=self.metric, computable=self.computable, score=finite(self.score),
                          floor=finite(self.floor), passed=self.passed)  # fmt: skip

    def describe(self) -> str:
        if not self.computable:
            return f"per-output checks (the task metric {self.metric} cannot be computed on the device: {self.why})"
        verdict = "meets" if self.passed else "is below"
        return f"task rule {self.metric} {self.score:.4g} {verdict} its floor {self.floor:.4g} ({self.why})"


def _bar(search: SearchReport, reference_score: float) -> tuple[float, str]:
    if search.min_score is not None:
        return search.min_score, f"--min-score {search.min_score:.4g}"
    if search.metric == "sqnr-db" or search.max_drop is None:
        return search.bar, f"the bar {search.bar:.4g}"
    bar = reference_score - search.max_drop
    return bar, f"FP32's {reference_score:.4g} on the golden set minus {search.max_drop:.4g}"


def judge_task(outputs: Mapping[str, np.ndarray], golden: GoldenSet, search: SearchReport) -> TaskVerdict:
    """The device's outputs on the golden inputs under the bundle's task rule (see the module docstring)."""
    reference = golden.reference
    found = device_metric(search.metric, reference)
    if isinstance(found, str):
        return TaskVerdict(search.metric, computable=False, why=found)
    labels = golden.inputs.labels
    got = {name: outputs[name] for name in reference if name in outputs}
    if any(got[n].shape != ref.shape for n, ref in reference.items() if n in got) or len(got) != len(reference):
        return TaskVerdict(search.metric, True, False, 0.0, 0.0, "an output is missing or has the wrong shape")
    try:
        score = float(found(reference, got, labels))
        own = float(found(reference, golden.expected, labels))  # the build's outputs, as the converter saw them
        ref_score = float(found(reference, reference, labels))
    except (ValueError, TypeError, IndexError) as err:  # outputs the metric cannot read: a failed check, named
        return TaskVerdict(search.metric, True, False, 0.0, 0.0, f"the metric failed on these outputs: {err}")
    bar, source = _bar(search, ref_score)
    if own >= bar - 1e-12:
        floor, why = bar, source
    else:
        slack = _SQNR_SLACK_DB if search.metric == "sqnr-db" else max(1.0 / max(1, len(golden.inputs)), 0.005)
        floor = own - slack
        why = f"{source}; the build itself scored {own:.4g} on these golden samples"
    passed = bool(np.isfinite(score)) and score >= floor - 1e-12
    return TaskVerdict(search.metric, True, passed, score, floor, why)
