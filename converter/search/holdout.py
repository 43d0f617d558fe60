"""Held-out judging for the mixed-precision recipes: they choose their float layers on one part of the evaluation
set and are judged on the other.

NNCF accuracy control and the ORT exclusion search pick which layers stay in float by scoring builds with the
task metric. Judged on the same samples, the shipped score is optimistically biased: a float set tuned until
it passes can pass on those samples alone. So the evaluation set is split once per conversion, deterministically
(a permutation seeded with SEED; the same data always splits the same way; the search request holds
both parts, converter.search.request):
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

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from edgefleet.converter.search.gate import Budget, MetricPlan, Score, gate, score
from edgefleet.converter.search.types import Built, Judgement
from edgefleet.core.tensors import Dataset

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


@dataclass(frozen=True)
class Part:
    """The evaluation data restricted to some samples, with the FP32 reference on them and its score."""

    name: Literal["selection", "held-out"]
    indices: tuple[int, ...]
    evaluation: Dataset
    reference: dict[str, np.ndarray]
    ref_value: float  # the FP32 model's own task score on these samples (its bar's reference)


def make_part(
    name: Literal["selection", "held-out"],
    indices: tuple[int, ...],
    evaluation: Dataset,
    reference: dict[str, np.ndarray],
    plan: MetricPlan,
) -> Part:
    index = np.asarray(indices, dtype=np.int64)
    labels = None if evaluation.labels is None else evaluation.labels[index]
    data = Dataset({k: v[index] for k, v in evaluation.inputs.items()}, labels)
    restricted = {k: v[index] for k, v in reference.items()}
    return Part(name, indices, data, restricted, score(restricted, restricted, labels, plan).value)


def _score_on(built: Built, chosen: Part, plan: MetricPlan, budget: Budget) -> tuple[Score, str | None]:
    assert built.outputs is not None
    index = np.asarray(chosen.indices, dtype=np.int64)
    outputs = {k: v[index] for k, v in built.outputs.items()}
    result = score(outputs, chosen.reference, chosen.evaluation.labels, plan)
    return result, gate(result, chosen.ref_value, budget)


def on_selection(built: Built, selection: Part, plan: MetricPlan, budget: Budget) -> tuple[Built, bool]:
    """`built` scored and gated on the selection part (a copy: the build memo keeps the original), and whether
    it met the bar there. A build that failed is returned as it is."""
    if built.error is not None or built.outputs is None:
        return built, False
    result, why = _score_on(built, selection, plan, budget)
    bar = budget.floor(plan.name, selection.ref_value)
    count = len(selection.indices)
    judged = Judgement("selection", count, selection.ref_value, bar, count, result.value)
    gated = f"selection split ({count} samples): {why}" if why else None
    return replace(built, score=result, gate=gated, judged=judged), why is None


def on_held_out(selected: Built, held_out: Part, selection: Part, plan: MetricPlan, budget: Budget) -> Built:
    """The variant a search settled on (having met the bar on the selection part), judged once on the held-out
    part: its score and gate there are the candidate's."""
    if selected.error is not None or selected.outputs is None:
        return selected
    assert selected.score is not None
    result, why = _score_on(selected, held_out, plan, budget)
    bar = budget.floor(plan.name, held_out.ref_value)
    judged = Judgement(
        "held-out", len(held_out.indices), held_out.ref_value, bar, len(selection.indices), selected.score.value
    )
    gated = (
        f"held-out split ({len(held_out.indices)} samples): {why}; it met the bar on the {len(selection.indices)} "
        f"selection samples it was chosen on ({selected.score.value:.4f})"
        if why
        else None
    )
    return replace(selected, score=result, gate=gated, judged=judged)
