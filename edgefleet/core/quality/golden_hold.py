"""One definition of "good enough" from converter to device: the golden figures a bundle will report on the device,
and the floor the rollout's default golden guardrail holds them to.

The device judges a bundle by `edgefleet.core.quality.golden.compare` on its golden set (agent/runtime/model.py
`check_golden`) and reports the result's `agreement` (telemetry `golden_agreement`) and each output's score. The
converter runs the same function on the candidate's own outputs for the same golden inputs, produced by the same
runtime where this host has it (`hold`): on the same runtime the device reproduces those outputs, so it reports the
same figures.

The rollout's default guardrail (edgefleet/control/rollout/judge/quality.py, with engine.py's planned drop) holds a
bundle that replaces the same model in FP32 (golden agreement and scores 1.0) to

    floor = 1.0 - d - min(planned, d),  d = the default max golden drop, planned = 1.0 - the build's own agreement

where `d` is the tightest accuracy budget of the bundles rolled out (`default_max_golden_drop`) and `planned` is
the drop the signed manifest announces (its golden floor plus one sample), allowed up to one more `d`. That is the
strictest floor a default rollout applies: a first bundle on a device is held to its own manifest floor (lower),
and a different model is judged against its own build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from edgefleet.core.bundle.manifest import GoldenHold, GoldenSpec, SearchReport
from edgefleet.core.quality.golden import GoldenResult, compare
from edgefleet.core.quality.golden_set import GoldenSet

DEFAULT_MAX_GOLDEN_DROP = 0.01  # the rollout's max_golden_drop when no bundle's accuracy budget is a share
FP32_BASELINE = 1.0  # an FP32 bundle's golden agreement and scores against its own reference


def default_max_golden_drop(budgets: Iterable[float | None]) -> float | None:
    """The rollout's default max golden drop for bundles with these accuracy budgets (`Manifest.accuracy.budget`):
    the tightest budget that is a share (0 ≤ b < 1), since golden agreement is one; budgets on another scale (an
    SQNR budget in dB) do not count, and with none left it is DEFAULT_MAX_GOLDEN_DROP. None: no bundle records a
    budget (the drop is not judged, as before budgets were recorded)."""
    known = [b for b in budgets if b is not None]
    shares = [b for b in known if 0.0 <= b < 1.0]
    if not known:
        return None
    return min(shares) if shares else DEFAULT_MAX_GOLDEN_DROP


def build_agreement(spec: GoldenSpec) -> float:
    """The build's own agreement as the rollout reads it from the manifest: its golden floor plus one sample."""
    return min(1.0, spec.min_agreement + 1.0 / spec.count)


def rollout_floor(spec: GoldenSpec, max_drop: float) -> float:
    """The strictest floor the default guardrail holds this bundle's golden agreement and scores to (the module
    docstring): replacing the same model in FP32, with the drop the build plans allowed up to one more `max_drop`."""
    planned = max(0.0, FP32_BASELINE - build_agreement(spec))
    return FP32_BASELINE - max_drop - min(planned, max_drop)


def hold(
    outputs: Mapping[str, np.ndarray],
    golden: GoldenSet,
    spec: GoldenSpec,
    search: SearchReport | None,
    max_drop: float,
    *,
    runtime: str,
    same_runtime: bool = True,
) -> tuple[GoldenHold, GoldenResult]:
    """The device's golden check on `outputs` (the bundle's outputs on the golden inputs, stacked per sample), and
    whether its figures meet the floor the rollout's default guardrail holds (`rollout_floor`); with the check's
    own result (its reason names what failed)."""
    result = compare(outputs, golden, spec, search)
    floor = rollout_floor(spec, max_drop)
    scores = {s.output: float(s.score) for s in result.scores}
    lowest = min([result.agreement, *scores.values()])
    figures = GoldenHold(
        agreement=round(float(result.agreement), 6),
        scores={k: round(v, 6) for k, v in scores.items()},
        max_drop=max_drop,
        floor=round(floor, 6),
        passed=result.passed and lowest >= floor - 1e-9,
        runtime=runtime,
        same_runtime=same_runtime,
    )
    return figures, result


def refusal(figures: GoldenHold, why_failed: str = "") -> str:
    """Why a candidate is refused for its golden figures (the conversion report's refusal list)."""
    if figures.passed:
        return ""
    lowest = min(figures.scores.items(), key=lambda kv: kv[1], default=("", figures.agreement))
    figure = (
        f"golden score of output {lowest[0]} {lowest[1]:.4f}"
        if lowest[0] and lowest[1] < figures.agreement
        else f"golden agreement {figures.agreement:.4f}"
    )
    if figures.agreement >= figures.floor - 1e-9 and lowest[1] >= figures.floor - 1e-9:
        return f"fails the device's golden check on its own outputs: {why_failed}"
    return (
        f"{figure} on the device ({figures.runtime}) would fail the rollout's default guardrail: below the floor "
        f"{figures.floor:.4f} (1.0 − {figures.max_drop:g}, widened by the drop the build plans, at most "
        f"{figures.max_drop:g}); give a larger --max-drop, or roll out with --max-golden-drop"
    )


__all__ = [
    "DEFAULT_MAX_GOLDEN_DROP",
    "build_agreement",
    "default_max_golden_drop",
    "hold",
    "refusal",
    "rollout_floor",
]
