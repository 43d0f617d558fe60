"""Choosing the execution provider: the agent's policy, what a measurement gave, and `choose`, a pure function
of (the providers the bundle allows, what is available here and why not, what was measured, the policy) → the
choice and, for every other provider, why it was not chosen. The I/O around it is in selection.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent.runtime.backends import Availability
from edgefleet.core.errors import BundleError
from edgefleet.core.quality.golden import GoldenResult


class Policy(BaseModel):
    """The agent's say in the choice (a field of the agent's config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefer: list[str] = Field(
        default_factory=list,
        description="providers to use whenever they pass the golden set, in this order, even when slower "
        "(e.g. openvino:NPU to save power)",
    )
    exclude: list[str] = Field(default_factory=list, description="providers never to use on this device")
    tie_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="candidates this close to the fastest count as equally fast; "
        "the bundle's order then decides (keeps the choice stable against timing noise)",
    )
    load_timeout_s: float = Field(default=60.0, gt=0, description="a load plus golden run taking longer is skipped")
    engine_build_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="the same limit when the load builds an engine that is not cached yet (TensorRT: minutes on "
        "a Jetson); later starts reuse the engine and get load_timeout_s",
    )
    measure_budget_s: float = Field(default=1.0, gt=0, description="time spent timing the candidates, all together")
    rounds: int = Field(default=7, ge=1, le=100, description="interleaved timing rounds")
    measure_in_worker: bool = Field(
        default=True,
        description="measure the candidates in a separate, time-bounded worker process, so that a runtime that "
        "was measured but not chosen leaves no memory behind in the agent (and a load that hangs or crashes is "
        "killed with its process); false measures them in the agent's own process (backends registered at run "
        "time, which a fresh process cannot see, need it)",
    )


@dataclass(frozen=True)
class Measurement:
    """What trying one candidate gave: an error, or its golden result and (when timed) its median latency."""

    provider: str
    error: str | None = None
    golden: GoldenResult | None = None
    median_ms: float | None = None
    load_ms: float | None = None


@dataclass(frozen=True)
class ProviderChoice:
    provider: str
    reasons: dict[str, str]  # provider -> why it was not used
    summary: str = ""  # why `provider` was
    medians_ms: dict[str, float] = field(default_factory=dict)
    cached: bool = False  # reused from the decision cache (the winner alone was loaded and checked)
    threads: int = 0  # the thread count it runs with (0: the runtime's default)
    threads_reason: str = ""  # why that count (agent/runtime/selection/threads.py)


class NoProviderError(BundleError):
    """None of the providers the bundle allows can run it here; the message gives each one's reason."""


def _ms(value: float) -> str:
    return f"{value:.4g} ms"


def choose(
    allowed: Sequence[str],
    availability: Mapping[str, Availability],
    measurements: Mapping[str, Measurement],
    policy: Policy,
) -> ProviderChoice:
    """The provider to run and why each other one is not used. Pure: no I/O, no clock."""
    reasons: dict[str, str] = {}
    qualified: list[str] = []
    for provider in dict.fromkeys(allowed):
        avail = availability.get(provider)
        measured = measurements.get(provider)
        if provider in policy.exclude:
            reasons[provider] = "excluded by the agent's policy"
        elif avail is None or not avail.ok:
            reasons[provider] = f"not available: {avail.reason if avail else 'not checked'}"
        elif measured is None:
            reasons[provider] = "not measured"
        elif measured.error:
            reasons[provider] = measured.error
        elif measured.golden is None or not measured.golden.passed:
            why = measured.golden.reason if measured.golden else "no golden result"
            reasons[provider] = f"outputs leave the golden tolerance: {why}"
        else:
            qualified.append(provider)
    if not qualified:
        detail = "; ".join(f"{p}: {r}" for p, r in reasons.items()) or "the bundle lists no provider"
        raise NoProviderError(f"none of the bundle's providers can run it here ({detail})")
    medians = {p: m for p in qualified if (m := measurements[p].median_ms) is not None and np.isfinite(m)}

    def versus(other: str, chosen: str) -> str:
        if other in medians and chosen in medians:
            return f"{_ms(medians[other])} median vs {_ms(medians[chosen])} on {chosen}"
        return "not timed"

    preferred = next((p for p in policy.prefer if p in qualified), None)
    if preferred is not None:
        for other in qualified:
            if other != preferred:
                reasons[other] = f"the agent's policy prefers {preferred} ({versus(other, preferred)})"
        timing = f", {_ms(medians[preferred])} median" if preferred in medians else ""
        return ProviderChoice(preferred, reasons, f"preferred by the agent's policy{timing}", medians)
    if len(qualified) == 1:
        only = qualified[0]
        return ProviderChoice(only, reasons, "the only candidate that loads and passes the golden set", medians)
    timed = [p for p in qualified if p in medians]
    if not timed:
        chosen = qualified[0]
        for other in qualified[1:]:
            reasons[other] = f"not timed; the bundle lists {chosen} first"
        return ProviderChoice(chosen, reasons, "first in the bundle's order (nothing was timed)", medians)
    fastest = min(timed, key=lambda p: medians[p])
    limit = medians[fastest] * (1 + policy.tie_margin)
    chosen = next(p for p in timed if medians[p] <= limit)  # `timed` keeps the bundle's order
    for other in qualified:
        if other == chosen:
            continue
        if other not in medians:
            reasons[other] = "not timed"
        elif medians[other] <= limit:
            reasons[other] = (
                f"as fast within {policy.tie_margin:.0%} ({versus(other, chosen)}); the bundle lists {chosen} first"
            )
        else:
            ratio = medians[other] / medians[chosen]
            reasons[other] = f"slower: {versus(other, chosen)} ({ratio:.2f}×)"
    summary = f"fastest of {len(timed)} measured: {_ms(medians[chosen])} median"
    if chosen != fastest:
        summary += f" (within {policy.tie_margin:.0%} of {fastest}, and earlier in the bundle's order)"
    return ProviderChoice(chosen, reasons, summary, medians)
