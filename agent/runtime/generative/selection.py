"""Choosing the provider of a generative bundle by measurement, as for any bundle (agent/runtime/selection/): each of
the manifest's providers that is available here is loaded, golden-checked on the golden prompts and timed (the
median time per output token of its greedy runs on them); `choose` (the same pure function as for tensor models)
keeps the fastest that passes and says why each other one was not chosen.

Candidates are measured one at a time in the agent's process, and each is closed after its measurement, so a runtime
measured but not chosen leaves no model behind; with more than one candidate the winner is loaded again and checked
once more. A single candidate is kept loaded. Decisions are not cached: a generative bundle lists one runtime's
devices, so there is rarely more than one candidate on a device.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgefleet.agent.runtime import backends
from edgefleet.agent.runtime.backends import Availability, CancelToken, LoadOptions
from edgefleet.agent.runtime.generative.backend import GenerativeBackend
from edgefleet.agent.runtime.generative.golden import GoldenVerdict, judge
from edgefleet.agent.runtime.generative.session import GenerationRequest, GenerativeSession
from edgefleet.agent.runtime.selection.policy import Measurement, NoProviderError, Policy, ProviderChoice, choose
from edgefleet.core.bundle.generation import GenerationSpec
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.quality.golden import GoldenResult

log = logging.getLogger(__name__)


@dataclass
class Selected:
    session: GenerativeSession
    choice: ProviderChoice
    golden: GoldenResult


@dataclass(frozen=True)
class _Trial:
    session: GenerativeSession | None
    measurement: Measurement


def bundle_threads(manifest: Manifest, configured: int) -> int:
    """The agent's configured count; else the count the bundle's token latency was measured at; else the runtime's."""
    if configured > 0:
        return configured
    spec = manifest.generation
    if spec is not None and spec.token_latency is not None and spec.token_latency.threads > 0:
        return spec.token_latency.threads
    return manifest.latency.threads if manifest.latency is not None and manifest.latency.threads > 0 else 0


def select(model_dir: Path, manifest: Manifest, golden: GoldenPrompts, *, threads: int, policy: Policy) -> Selected:
    """Load the bundle on its best provider here; NoProviderError says why each one could not serve."""
    spec = manifest.generation
    if spec is None:
        raise NoProviderError(f"bundle {manifest.bundle_id} is not generative")
    options = LoadOptions(threads=threads, precision=manifest.recipe.precision, runtime_config=spec.runtime_config)
    allowed = list(dict.fromkeys(manifest.providers))
    availability: dict[str, Availability] = {}
    measurements: dict[str, Measurement] = {}
    kept: dict[str, GenerativeSession] = {}
    for provider in allowed:
        if provider not in policy.exclude:
            availability[provider] = backends.availability(provider, manifest.format)
    runnable = [p for p, found in availability.items() if found.ok]
    for provider in runnable:
        trial = _try(provider, model_dir, options, golden, spec)
        measurements[provider] = trial.measurement
        if trial.session is None:
            continue
        if len(runnable) > 1:  # measured, then released: the winner is loaded again
            trial.session.close()
        else:
            kept[provider] = trial.session
    try:
        choice = choose(allowed, availability, measurements, policy)
    except NoProviderError:
        for unused in kept.values():
            unused.close()
        raise
    choice = replace(choice, summary=f"{choice.summary} (time per output token on the golden prompts)",
                     threads=threads)  # fmt: skip
    session = kept.get(choice.provider)
    verdict = measurements[choice.provider].golden
    if session is None:
        again = _try(choice.provider, model_dir, options, golden, spec)
        if again.session is None:
            why = again.measurement.error or (again.measurement.golden.reason if again.measurement.golden else "")
            raise NoProviderError(f"{choice.provider} passed when measured but not when loaded again: {why}")
        session, verdict = again.session, again.measurement.golden
    assert verdict is not None
    log.info("provider %s for %s: %s; not chosen: %s", choice.provider, manifest.bundle_id, choice.summary,
             choice.reasons or "none")  # fmt: skip
    return Selected(session, choice, verdict)


def _try(provider: str, model_dir: Path, options: LoadOptions, golden: GoldenPrompts, spec: GenerationSpec) -> _Trial:
    """Load, warm up, golden-check and time one provider; its session only when it passed."""
    backend = backends.backend_for(provider)
    if not isinstance(backend, GenerativeBackend):
        return _Trial(None, Measurement(provider, error=f"{backend.title} is not a generation runtime"))
    start = time.perf_counter()
    try:
        session = backend.load(model_dir, provider, options, CancelToken())
    except Exception as err:  # LoadError, or a runtime's own exception: the provider is skipped with its reason
        return _Trial(None, Measurement(provider, error=f"load failed: {err}"))
    load_ms = (time.perf_counter() - start) * 1000
    stop_ids = frozenset(spec.eos_token_ids)
    try:  # the first generation pays one-time costs (compiled kernels, caches) that must not count as its speed
        session.generate(GenerationRequest(tuple(golden.prompts[0].ids), 2, stop_ids), lambda _piece: None)
    except Exception as err:
        session.close()
        return _Trial(None, Measurement(provider, error=f"generation failed: {err}", load_ms=load_ms))
    verdict: GoldenVerdict = judge(session, golden, spec.context_length, stop_ids)
    measurement = Measurement(provider, golden=verdict.result, median_ms=verdict.tpot_ms, load_ms=load_ms)
    if not verdict.result.passed:
        session.close()
        return _Trial(None, measurement)
    return _Trial(session, measurement)


__all__ = ["Selected", "bundle_threads", "select"]
