"""The golden gate: a candidate ships only when the golden figures the device will report for it meet the floor the
rollout's default guardrail holds (edgefleet.core.quality.golden_hold).

The golden set is the head of the evaluation set with the FP32 reference outputs and the candidate's own outputs,
and its per-output checks are derived from them, exactly as the bundle will carry them (`golden_of`, which the
bundle writer uses); the device's golden check (edgefleet.core.quality.golden.compare) then runs on the candidate's
outputs, computed by the candidate's runtime on this host. A candidate the task metric accepts on the evaluation set
can still fail there: its golden samples are a subset, and the device judges each output by its kind's rule (argmax
agreement for class scores) where the user's metric may be another (cosine).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.request import SearchRequest
from edgefleet.converter.search.types import Built, Spec
from edgefleet.core.bundle.manifest import GoldenHold, GoldenSpec, OutputRule, SearchReport
from edgefleet.core.quality.golden import compare
from edgefleet.core.quality.golden_hold import default_max_golden_drop, hold, refusal
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.output_rules import derive_checks

GOLDEN_COUNT = 64  # at least this many golden samples when the evaluation set has them
CONTINUOUS_METRICS = ("cosine",)  # a task metric that judges an output as a vector: its golden rule is continuous


def golden_of(request: SearchRequest, outputs: Mapping[str, np.ndarray], spec: Spec) -> tuple[GoldenSet, GoldenSpec]:
    """The golden set and its checks for a candidate with these outputs on the evaluation set: what its bundle
    carries and the device re-runs."""
    evaluation, reference = request.evaluation, request.reference
    count = min(GOLDEN_COUNT, len(evaluation))
    order = [request.plan.output] + [k for k in reference if k != request.plan.output]  # the device judges the first
    golden = GoldenSet(
        inputs=evaluation.head(count),
        reference={k: _plain(reference[k][:count]) for k in order},
        expected={k: _plain(outputs[k][:count]) for k in order},
    )
    floats = [np.abs(v) for v in golden.expected.values() if np.issubdtype(v.dtype, np.floating)]
    scale = max([1.0] + [float(np.max(v)) for v in floats if v.size])
    # Other CPUs pick other kernels: FP32 differs in the last bits, INT8/FP16 can move by a quantization step.
    # TensorRT engines and CoreML run their own kernels (TF32/FP16 tactics) against this host's proxy outputs.
    exact = spec.precision == "fp32" and spec.format not in ("onnx-tensorrt", "coreml")
    tolerance = (1e-3 if exact else 5e-2) * scale
    judged = [k for k in order if k not in request.plan.skipped]  # an input passed through is never judged
    checks = derive_checks({k: golden.reference[k] for k in judged}, golden.expected, tolerance, _rules(request))
    unset = GoldenSpec(count=count, max_abs_error=tolerance, min_agreement=0.0, outputs=checks)
    # The manifest's golden floor (a first bundle on a device is held to it): the agreement the device will report
    # for these outputs (the same function it runs), less one sample.
    agreement = compare(golden.expected, golden, unset).agreement
    return golden, unset.model_copy(update={"min_agreement": max(0.0, agreement - 1.0 / count)})


def _rules(request: SearchRequest) -> dict[str, OutputRule]:
    """The judged output's golden rule where the task metric says what it is: an output judged by cosine (an
    embedding) is a vector on the device too, never class scores by its argmax."""
    return {request.plan.output: "continuous"} if request.plan.name in CONTINUOUS_METRICS else {}


def max_drop_of(request: SearchRequest, budget: Budget) -> float:
    """The rollout's default max golden drop for a bundle of this search: from the accuracy budget its manifest
    will record (edgefleet.core.quality.golden_hold.default_max_golden_drop)."""
    drop = default_max_golden_drop([budget.allowed_drop(request.plan.name, request.ref_value)])
    assert drop is not None  # a budget was given
    return drop


def golden_figures(
    request: SearchRequest, built: Built, budget: Budget, search: SearchReport | None = None
) -> tuple[GoldenHold, str]:
    """The figures the device will report for `built` and the floor they are held to, and why the candidate is
    refused for them (empty when it is not)."""
    assert built.outputs is not None
    golden, spec = golden_of(request, built.outputs, built.spec)
    same = not built.spec.as_written and built.proxy is None and built.spec.format not in ("coreml", "onnx-tensorrt")
    figures, result = hold(
        golden.expected, golden, spec, search, max_drop_of(request, budget),
        runtime=f"{built.spec.runtime} {built.spec.run_on}", same_runtime=same,
    )  # fmt: skip
    return figures, refusal(figures, result.reason)


def _plain(values: np.ndarray) -> np.ndarray:
    """String outputs (class names) come from onnxruntime as object arrays, which only pickle: store unicode."""
    return values.astype(str) if values.dtype == object else values


__all__ = ["GOLDEN_COUNT", "golden_figures", "golden_of", "max_drop_of"]
