"""How many threads the chosen provider runs with: the bundle's, unless this device's own measurement says
otherwise.

The converter timed its candidates at the thread counts the profile states (the manifest's `search.threads`, the
first decided). An agent left to choose (its `threads` setting 0) measures the providers at the bundle's first
count, then times the winner at each count the bundle was timed at and at the runtime's own default (0: ONNX
Runtime takes the physical cores, OpenVINO its own choice), interleaved, and keeps the fastest. The bundle's count
keeps a tie (within the policy's tie margin), so timing noise cannot flip the choice. An agent configured with a
thread count uses it as it is and measures nothing. Leaving the bundle's count takes a second timing that agrees,
so one noisy timing cannot flip it. The count and the reason are cached with the provider choice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgefleet.agent.runtime.backends import LoadOptions
from edgefleet.agent.runtime.selection.cache import DecisionCache
from edgefleet.agent.runtime.selection.policy import Policy
from edgefleet.agent.runtime.selection.trial import Trial, time_interleaved, timing_calls, try_load
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.quality.golden import GoldenSet

log = logging.getLogger(__name__)


def bundle_threads(manifest: Manifest) -> list[int]:
    """The thread counts the bundle was timed at, the deciding one first; empty when it does not say."""
    if manifest.search is not None and manifest.search.threads:
        return list(dict.fromkeys(manifest.search.threads))
    if manifest.latency is not None and manifest.latency.threads > 0:
        return [manifest.latency.threads]
    return []


def candidates(manifest: Manifest, configured: int) -> list[int]:
    """Thread counts to try, the starting one first: the configured count alone, or the bundle's and the
    runtime default (0)."""
    if configured > 0:
        return [configured]
    return list(dict.fromkeys([*bundle_threads(manifest), 0]))


def unmeasured_reason(manifest: Manifest, start: int) -> str:
    if not bundle_threads(manifest):
        return f"{describe(start)}: the bundle records no thread count"
    if start not in bundle_threads(manifest):
        return f"{describe(start)}, as the agent is configured (the bundle was timed at {bundle_threads(manifest)})"
    return f"{describe(start)}, as the agent is configured and the bundle was timed"


def describe(count: int) -> str:
    return "the runtime's default threads" if count == 0 else f"{count} thread{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str
    medians_ms: dict[int, float]


def choose_threads(
    start: int, medians: Mapping[int, float], failed: Mapping[int, str], tie_margin: float
) -> ThreadChoice:
    """The count to run with: `start` (the bundle's) unless another measured faster by more than the tie margin.
    Pure: no I/O, no clock."""
    timed = {c: m for c, m in medians.items()}
    others = "; ".join(f"{describe(c)}: {why}" for c, why in failed.items())
    tail = f" ({others})" if others else ""
    if start not in timed or len(timed) < 2:
        why = f"nothing else to compare; {others}" if others else "nothing else to compare"
        return ThreadChoice(start, f"{describe(start)}, as the bundle was timed ({why})", timed)
    fastest = min(timed, key=lambda c: timed[c])
    listed = ", ".join(f"{describe(c)} {m:.4g} ms" for c, m in timed.items())
    if fastest != start and timed[fastest] < timed[start] / (1 + tie_margin):
        ratio = timed[start] / timed[fastest]
        return ThreadChoice(
            fastest, f"{describe(fastest)}: measured {ratio:.2f}× faster here than the bundle's {describe(start)} "
            f"(medians {listed}){tail}", timed,
        )  # fmt: skip
    return ThreadChoice(
        start, f"{describe(start)}, as the bundle was timed: no other count measured faster by more than "
        f"{tie_margin:.0%} (medians {listed}){tail}", timed,
    )  # fmt: skip


def tune(
    provider: str,
    trial: Trial,
    counts: Sequence[int],
    model_path: Path,
    options: LoadOptions,
    golden: GoldenSet,
    manifest: Manifest,
    policy: Policy,
    cache: DecisionCache | None,
    key: str,
) -> tuple[Trial, ThreadChoice]:
    """Time the winner's session (loaded at counts[0]) against sessions at the other counts; keep the fastest.
    Each other session must pass the golden set too; the ones not kept are closed."""
    start = counts[0]
    if len(counts) < 2 or trial.session is None:
        return trial, ThreadChoice(start, unmeasured_reason(manifest, start), {})
    trials: dict[int, Trial] = {start: trial}
    failed: dict[int, str] = {}
    for count in counts[1:]:
        other = try_load(
            provider, model_path, replace(options, threads=count), golden, manifest, policy.load_timeout_s, cache,
            key, policy.engine_build_timeout_s,
        )  # fmt: skip
        verdict = other.measurement.golden
        if other.session is not None and verdict is not None and verdict.passed:
            trials[count] = other
            continue
        if other.session is not None:
            other.session.close()
        failed[count] = other.measurement.error or (verdict.reason if verdict else "no golden result")
    medians: dict[int, float] = {}
    if len(trials) > 1:
        sessions = {str(c): t.session for c, t in trials.items() if t.session is not None}
        calls = timing_calls(policy, {str(c): t.call_s for c, t in trials.items()})

        def timed() -> dict[int, float]:
            found = time_interleaved(sessions, list(golden.inputs.samples()), calls, policy.rounds)
            return {int(c): m for c, m in found.items()}

        medians = timed()
    choice = choose_threads(start, medians, failed, policy.tie_margin)
    if choice.threads != start:  # leaving the bundle's count takes a second timing that agrees (noise flips one)
        again = choose_threads(start, timed(), failed, policy.tie_margin)
        if again.threads != choice.threads:
            choice = ThreadChoice(
                start, f"{describe(start)}, as the bundle was timed: {describe(choice.threads)} measured faster "
                f"once ({choice.reason.split(': ', 1)[-1]}) but not in a second timing", medians,
            )  # fmt: skip
    for count, other in trials.items():
        if count != choice.threads and other.session is not None:
            other.session.close()
    log.info("%s for %s: %s", provider, manifest.bundle_id, choice.reason)
    return trials[choice.threads], choice
