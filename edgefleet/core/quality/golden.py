"""The golden set: inputs with the FP32 reference outputs, re-run on the device before commit and periodically.

Stored as an .npz (no pickles): one key per model input, `labels` when known, `reference/<output>`
(the FP32 source model's outputs) and `expected/<output>` (this bundle's own outputs at build time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgefleet.core.bundle.manifest import GoldenSpec, OutputCheck, SearchReport
from edgefleet.core.messages import GoldenTask, OutputScore
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.output_rules import agreement_of, derive_check, explain, is_label, score
from edgefleet.core.quality.task_rule import judge_task


@dataclass(frozen=True)
class GoldenResult:
    agreement: float
    max_abs_error: float
    passed: bool
    reason: str
    scores: tuple[OutputScore, ...] = ()  # one per output, by the rule its kind calls for
    rule: str = "per-output checks"  # which rule judged: the bundle's task rule, or the per-output checks alone
    task: GoldenTask | None = None  # the task rule's metric and score, for telemetry


def argmax_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose top class matches; outputs are (samples, *model output shape)."""
    if outputs.shape != reference.shape:
        return 0.0
    flat_out = outputs.reshape(len(outputs), -1)
    flat_ref = reference.reshape(len(reference), -1)
    return float(np.mean(flat_out.argmax(axis=1) == flat_ref.argmax(axis=1)))


def checks_for(golden: GoldenSet, spec: GoldenSpec) -> list[OutputCheck]:
    """The manifest's per-output checks; a bundle built before them gets checks derived here from its own
    golden data (the build's outputs against the FP32 reference), never a blind argmax."""
    recorded = {check.output: check for check in spec.outputs}
    checks = []
    for name, reference in golden.reference.items():
        check = recorded.get(name)
        if check is None or (check.rule == "continuous" and is_label(reference)):  # labels: exact, never as numbers
            check = derive_check(name, reference, golden.expected[name], spec.max_abs_error)
        checks.append(check)
    return checks


def _max_abs(got: np.ndarray, expected: np.ndarray) -> float:
    """|device - build| of one numeric output; labels (strings, ids) are judged by their agreement rule instead
    (exact equality per sample against the FP32 reference), so they add nothing here."""
    if is_label(expected) or is_label(got):
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))) if expected.size else 0.0


def compare(
    outputs: Mapping[str, np.ndarray], golden: GoldenSet, spec: GoldenSpec, task: SearchReport | None = None
) -> GoldenResult:
    """Judge a device's outputs on the golden inputs: the bundle's task rule where the manifest records one the
    device can compute (edgefleet/core/quality/task_rule.py), each output by its kind's rule against the FP32
    reference, and every output within `spec.max_abs_error` of the build's own outputs. All must hold; `rule`
    and the reason say which rule judged. A manifest without a task metric gets the per-output checks alone."""
    checks = checks_for(golden, spec)
    scores = tuple(score(check, outputs.get(check.output), golden.reference[check.output]) for check in checks)
    agreement = min((agreement_of(s) for s in scores), default=0.0)
    errors = [
        _max_abs(outputs[name], expected)
        for name, expected in golden.expected.items()
        if name in outputs and outputs[name].shape == expected.shape
    ]
    max_abs = max(errors) if len(errors) == len(golden.expected) else float("inf")
    verdict = judge_task(outputs, golden, task) if task is not None else None
    rule = f"task rule {verdict.metric}" if verdict is not None and verdict.computable else "per-output checks"
    task_score = verdict.message() if verdict is not None else None
    failed = [explain(s, c) for s, c in zip(scores, checks, strict=True) if not s.passed]
    if not np.isfinite(max_abs) or max_abs > spec.max_abs_error:
        failed.append(f"max |error| {max_abs:.3g} exceeds the tolerance {spec.max_abs_error:.3g}")
    if verdict is not None and verdict.computable and not verdict.passed:
        failed.insert(0, verdict.describe())
    elif failed and verdict is not None:  # what failed comes first; then which rule judged and what it said
        failed.append(f"while {verdict.describe()}" if verdict.computable else verdict.describe())
    if failed:
        return GoldenResult(agreement, max_abs, False, "; ".join(failed), scores, rule, task_score)
    judged = f"judged by {verdict.describe()}; " if verdict is not None else ""
    summary = ", ".join(f"{s.output} {s.rule} {s.score:.4g}" for s in scores)
    return GoldenResult(
        agreement, max_abs, True, f"{judged}agreement {agreement:.3f}, max |error| {max_abs:.3g} ({summary})", scores,
        rule, task_score,
    )  # fmt: skip
