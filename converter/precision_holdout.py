"""Held-out judging for the mixed-precision recipes: they choose their float layers on one part of the evaluation
set and are judged on the other.

NNCF accuracy control and the ORT exclusion search pick which layers stay in float by scoring builds with the
task metric. Judged on the same samples, the shipped score is optimistically biased: a float set tuned until
it passes can pass on those samples alone. So the evaluation set is split once per conversion, deterministically
(a permutation seeded with SEED; the same data always splits the same way):
- the **selection** part (the first half of the permutation) is what NNCF validates on and what the exclusion
  search's builds are confirmed on;
- the **held-out** part (the other half) judges the variant the search settled on, once: its score and gate there
  are the candidate's score and gate, in the report and in the manifest (`accuracy.judged_on`). A variant that
  met the bar on the selection part and misses it held out is refused, with both figures.
Plain recipes (FP32, FP16, bf16, plain INT8 and its calibration and head-in-float retries) select nothing and
are judged on the whole evaluation set, as before.

An evaluation set with fewer than 2 x MIN_PART samples cannot be split into two parts that each say something:
mixed precision is then not tried, and the report says why (judging on the selection data is never a pass).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from edgefleet.converter.accuracy import Budget, Score, gate, score
from edgefleet.core.manifest import AccuracyReport, SearchReport
from edgefleet.core.tensors import Dataset

if TYPE_CHECKING:
    from edgefleet.converter.candidates import Built
    from edgefleet.converter.context import Context

SEED = 12  # the split's permutation seed: fixed, so a conversion is reproducible
MIN_PART = 8  # samples each part needs at least


@dataclass(frozen=True)
class Split:
    """Sample indices of the evaluation set: `selection` tunes, `held_out` judges. `refused` says why there is
    no split (too few samples); both are then empty."""

    selection: tuple[int, ...]
    held_out: tuple[int, ...]
    total: int
    refused: str = ""

    def describe(self) -> str:
        return (
            f"{len(self.selection)} selection / {len(self.held_out)} held-out samples of {self.total} "
            f"(seeded split, seed {SEED})"
        )


def split_indices(count: int, min_part: int = MIN_PART, seed: int = SEED) -> Split:
    """The deterministic split of `count` evaluation samples into two halves (the held-out one gets the odd one)."""
    if count < 2 * min_part:
        return Split((), (), count, refused=(
            f"mixed precision not tried: the evaluation set has {count} samples, and choosing float layers on one "
            f"part while judging on another needs at least {2 * min_part} ({min_part} each); give a larger "
            "--eval set"
        ))  # fmt: skip
    order = np.random.default_rng(seed).permutation(count)
    half = count // 2
    return Split(tuple(sorted(int(i) for i in order[:half])), tuple(sorted(int(i) for i in order[half:])), count)


def split_of(ctx: Context) -> Split:
    """The conversion's split (one per evaluation set)."""
    if "holdout-split" not in ctx.memo:
        ctx.memo["holdout-split"] = split_indices(len(ctx.evaluation))
    found: Split = ctx.memo["holdout-split"]
    return found


@dataclass(frozen=True)
class Part:
    """The evaluation data restricted to some samples, with the FP32 reference on them and its score."""

    name: Literal["selection", "held-out"]
    indices: tuple[int, ...]
    evaluation: Dataset
    reference: dict[str, np.ndarray]
    ref_value: float  # the FP32 model's own task score on these samples (its bar's reference)


def part(ctx: Context, name: Literal["selection", "held-out"]) -> Part:
    split = split_of(ctx)
    assert not split.refused, split.refused
    indices = split.selection if name == "selection" else split.held_out
    key = f"holdout-part:{name}"
    if key not in ctx.memo:
        index = np.asarray(indices, dtype=np.int64)
        labels = None if ctx.evaluation.labels is None else ctx.evaluation.labels[index]
        evaluation = Dataset({k: v[index] for k, v in ctx.evaluation.inputs.items()}, labels)
        reference = {k: v[index] for k, v in ctx.reference.items()}
        ref_value = score(reference, reference, labels, ctx.plan).value
        ctx.memo[key] = Part(name, indices, evaluation, reference, ref_value)
    found: Part = ctx.memo[key]
    return found


@dataclass(frozen=True)
class Judgement:
    """Which data judged a candidate, as the report and the manifest state it."""

    on: Literal["selection", "held-out"]
    samples: int  # samples of the part that judged it
    reference: float  # the FP32 model's score on that part
    bar: float  # the floor on that part (a drop budget is relative to `reference`)
    selection_samples: int
    selection_score: float | None  # the score the search confirmed it with (held-out judgements)

    def describe(self) -> str:
        if self.on == "selection":
            return f"selection split ({self.samples} samples; not judged held out: it missed the bar there)"
        return (
            f"held-out split ({self.samples} samples), float layers chosen on the selection split "
            f"({self.selection_samples} samples, score {self.selection_score:.4f})"
        )


def _score_on(ctx: Context, built: Built, chosen: Part, budget: Budget) -> tuple[Score, str | None]:
    assert built.outputs is not None
    index = np.asarray(chosen.indices, dtype=np.int64)
    outputs = {k: v[index] for k, v in built.outputs.items()}
    result = score(outputs, chosen.reference, chosen.evaluation.labels, ctx.plan)
    return result, gate(result, chosen.ref_value, budget)


def on_selection(ctx: Context, built: Built, budget: Budget) -> tuple[Built, bool]:
    """`built` scored and gated on the selection part (a copy: the build memo keeps the original), and whether
    it met the bar there. A build that failed is returned as it is."""
    if built.error is not None or built.outputs is None:
        return built, False
    chosen = part(ctx, "selection")
    result, why = _score_on(ctx, built, chosen, budget)
    bar = budget.floor(ctx.plan.name, chosen.ref_value)
    judged = Judgement("selection", len(chosen.indices), chosen.ref_value, bar, len(chosen.indices), result.value)
    gated = f"selection split ({len(chosen.indices)} samples): {why}" if why else None
    return replace(built, score=result, gate=gated, judged=judged), why is None


def on_held_out(ctx: Context, selected: Built, budget: Budget) -> Built:
    """The variant a search settled on (having met the bar on the selection part), judged once on the held-out
    part: its score and gate there are the candidate's."""
    if selected.error is not None or selected.outputs is None:
        return selected
    chosen, tuned = part(ctx, "held-out"), part(ctx, "selection")
    assert selected.score is not None
    result, why = _score_on(ctx, selected, chosen, budget)
    bar = budget.floor(ctx.plan.name, chosen.ref_value)
    judged = Judgement("held-out", len(chosen.indices), chosen.ref_value, bar, len(tuned.indices), selected.score.value)
    gated = (
        f"held-out split ({len(chosen.indices)} samples): {why}; it met the bar on the {len(tuned.indices)} "
        f"selection samples it was chosen on ({selected.score.value:.4f})"
        if why
        else None
    )
    return replace(selected, score=result, gate=gated, judged=judged)


def selection_bar(ctx: Context, budget: Budget) -> float:
    """The task bar on the selection part (a drop budget is relative to the FP32 model's score there)."""
    return budget.floor(ctx.plan.name, part(ctx, "selection").ref_value)


def accuracy_report(ctx: Context, built: Built, budget: Budget, evaluation_samples: int) -> AccuracyReport:
    """The manifest's accuracy section: the score and the FP32 reference on the data that judged the bundle."""
    assert built.score is not None
    judged = built.judged
    reference = judged.reference if judged is not None else ctx.ref_value
    return AccuracyReport(
        metric=ctx.plan.name,
        value=built.score.value,
        reference=reference,
        budget=budget.allowed_drop(ctx.plan.name, reference),
        samples=judged.samples if judged is not None else evaluation_samples,
        passed=True,
        judged_on=judged.describe() if judged is not None else "evaluation set",
        selection_samples=judged.selection_samples if judged is not None else 0,
    )


def with_judgements(report: SearchReport, built: Iterable[Built]) -> SearchReport:
    """The search report with the split that judged each mixed-precision candidate."""
    judged = {b.spec.name: b.judged.describe() for b in built if b.judged is not None}
    return report.model_copy(update={"judged_on": judged}) if judged else report
