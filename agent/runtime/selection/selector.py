"""Choosing the execution provider by measurement.

`choose` (selection_policy.py) is a pure function of (the providers the bundle allows, what is available here
and why not, what was measured, the agent's policy) → the choice and, for every other provider, why it was not
chosen. `select` is the I/O around it: check each candidate's availability, load it (time-bounded), run the
golden inputs, drop those whose outputs leave the bundle's tolerance, time the rest in interleaved rounds
(medians), choose, and cache the decision (selection_cache.py) keyed by bundle, hardware, runtime versions and
policy, so that a restart loads only the winner and a runtime upgrade measures again.

Where there is more than one candidate, they are measured in a separate worker process (selection_worker.py):
a runtime that was measured but not chosen then leaves nothing behind in the agent, and a load that hangs or
crashes is killed with its worker. The agent loads only the winner, checking it against the golden set again.
With one candidate, or `Policy(measure_in_worker=False)`, candidates are loaded in the agent's own process
(selection_trial.py), where a hung load is abandoned on its thread and a crash is caught by the cache's journal
at the next start.

A cold selection does no more than its decision needs: a provider whose runtime cannot load the bundle's format
at all is ruled out here from the backend's declaration (no worker, no probe; with one candidate left there is
no worker at all); the timing rounds end once one provider is clearly the fastest (selection_trial.clear_leader);
the CPU EP is loaded in the agent as soon as the worker reports that it passed, while the worker measures the
rest (selection_early.py), so a CPU EP winner is ready when the worker finishes; and the agent starts the worker
when it accepts an offer, so that the worker's imports overlap the download (selection_prestart.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgefleet.agent.runtime import backends, custom_ops
from edgefleet.agent.runtime.backends import Availability, LoadOptions, Session
from edgefleet.agent.runtime.selection import process as selection_process
from edgefleet.agent.runtime.selection import threads as selection_threads
from edgefleet.agent.runtime.selection.cache import (
    CACHE_FILE,
    DecisionCache,
    decision_key,
    hardware_fingerprint,
    model_identity,
)
from edgefleet.agent.runtime.selection.concurrent_load import EarlyLoads
from edgefleet.agent.runtime.selection.policy import Measurement, NoProviderError, Policy, ProviderChoice, choose
from edgefleet.agent.runtime.selection.process import WorkerUnavailable
from edgefleet.agent.runtime.selection.trial import (
    Trial,
    abandoned_loads,
    load_options,
    time_interleaved,
    timing_calls,
    try_load,
)
from edgefleet.agent.runtime.selection.warm_start import misfits
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.quality.golden import GoldenResult, GoldenSet

log = logging.getLogger(__name__)


@dataclass
class Selected:
    session: Session
    choice: ProviderChoice
    golden: GoldenResult


@dataclass
class _Candidates:
    availability: dict[str, Availability]
    measurements: dict[str, Measurement]
    trials: dict[str, Trial]  # sessions still open in this process

    def close(self, keep: str | None = None) -> None:
        for provider, trial in self.trials.items():
            if provider != keep and trial.session is not None:
                trial.session.close()


def select(
    model_path: Path,
    manifest: Manifest,
    golden: GoldenSet,
    *,
    threads: int = 0,
    cache_dir: Path | None = None,
    policy: Policy | None = None,
    bundle_dir: Path | None = None,
    custom_op_libraries: Sequence[str] = (),
) -> Selected:
    """Load the bundle on the best provider here (see the module docstring). Raises NoProviderError.

    `model_path` may differ from the bundle's own file (a copy with custom-op domains renamed);
    `custom_op_libraries` are registered before each load."""
    try:
        return _select(
            model_path, manifest, golden, threads, cache_dir, policy or Policy(), bundle_dir, custom_op_libraries
        )
    finally:
        selection_process.discard()  # a worker prestarted for this bundle (selection_prestart.py) and not taken


def _select(
    model_path: Path,
    manifest: Manifest,
    golden: GoldenSet,
    threads: int,
    cache_dir: Path | None,
    policy: Policy,
    bundle_dir: Path | None,
    custom_op_libraries: Sequence[str],
) -> Selected:
    counts = selection_threads.candidates(manifest, threads)  # the bundle's count first, unless configured
    options = load_options(manifest, counts[0], cache_dir, bundle_dir, custom_op_libraries)
    allowed = list(dict.fromkeys(manifest.providers))
    key, parts = decision_key(manifest, threads, policy)
    cache = DecisionCache(cache_dir) if cache_dir is not None else None
    if cache is not None:
        for stale_key, provider in cache.recover_journals():
            log.error("provider %s crashed or hung an earlier agent while loading (decision %s)", provider, stale_key)
    entry = cache.get(key) if cache else {}
    poisoned: dict[str, str] = dict(entry.get("poisoned", {}))

    cached = entry.get("provider")
    custom = tuple(op.key for op in manifest.custom_ops)
    if (
        cache is not None
        and isinstance(cached, str)
        and cached in allowed
        and cached not in policy.exclude
        and backends.availability(cached, manifest.format, custom_ops=custom).ok
    ):
        cached_threads = entry.get("threads")
        cached_threads = cached_threads if isinstance(cached_threads, int) and cached_threads in counts else counts[0]
        trial = _load(
            cached, model_path, replace(options, threads=cached_threads), golden, manifest, policy, cache, key
        )
        if trial.session is not None and trial.measurement.golden is not None and trial.measurement.golden.passed:
            stored = dict(entry.get("reasons", {}))
            choice = ProviderChoice(
                cached,
                {p: stored[p] for p in allowed if p in stored},
                str(entry.get("summary", "")),
                dict(entry.get("medians_ms", {})),
                cached=True,
                threads=cached_threads,
                threads_reason=str(entry.get("threads_reason", "")),
            )
            return Selected(trial.session, choice, trial.measurement.golden)
        if trial.session is not None:
            trial.session.close()
        log.warning("cached choice %s no longer checks out (%s); measuring again", cached, trial.measurement)
        cache.forget_decision(key)
        poisoned = dict(cache.get(key).get("poisoned", {}))

    candidates = _measure(
        [p for p in allowed if p not in policy.exclude], poisoned, model_path, manifest, golden, options, policy,
        cache, key,
    )  # fmt: skip
    while True:
        try:
            choice = choose(allowed, candidates.availability, candidates.measurements, policy)
        except NoProviderError:
            candidates.close()
            raise
        chosen = candidates.trials.get(choice.provider)
        if chosen is None:  # measured in a worker: load the winner here, and check it again
            chosen = _load(choice.provider, model_path, options, golden, manifest, policy, cache, key)
            verdict = chosen.measurement
            if chosen.session is None or verdict.golden is None or not verdict.golden.passed:
                if chosen.session is not None:
                    chosen.session.close()
                why = verdict.error or (verdict.golden.reason if verdict.golden else "no golden result")
                candidates.measurements[choice.provider] = Measurement(
                    choice.provider, error=f"passed in the measuring worker but not in the agent: {why}"
                )
                continue
        break
    candidates.close(keep=choice.provider)
    chosen, threads_choice = selection_threads.tune(
        choice.provider, chosen, counts, model_path, options, golden, manifest, policy, cache, key
    )
    choice = replace(
        choice, summary=f"{choice.summary}; {threads_choice.reason}", threads=threads_choice.threads,
        threads_reason=threads_choice.reason,
    )  # fmt: skip
    log.info(
        "provider %s for %s: %s; not chosen: %s",
        choice.provider,
        manifest.bundle_id,
        choice.summary,
        choice.reasons or "none",
    )
    if cache is not None:
        cache.update(
            key,
            provider=choice.provider,
            reasons=choice.reasons,
            summary=choice.summary,
            medians_ms=choice.medians_ms,
            threads=choice.threads,
            threads_reason=choice.threads_reason,
            bundle_id=manifest.bundle_id,
            parts=parts,
        )
    assert chosen.session is not None and chosen.measurement.golden is not None  # passing is a precondition
    return Selected(chosen.session, choice, chosen.measurement.golden)


def _load(
    provider: str,
    model_path: Path,
    options: LoadOptions,
    golden: GoldenSet,
    manifest: Manifest,
    policy: Policy,
    cache: DecisionCache | None,
    key: str,
) -> Trial:
    return try_load(
        provider, model_path, options, golden, manifest, policy.load_timeout_s, cache, key,
        policy.engine_build_timeout_s,
    )  # fmt: skip


def _measure(
    candidates: list[str],
    poisoned: dict[str, str],
    model_path: Path,
    manifest: Manifest,
    golden: GoldenSet,
    options: LoadOptions,
    policy: Policy,
    cache: DecisionCache | None,
    key: str,
) -> _Candidates:
    """Availability and measurements of every candidate: in a worker process when there are several, else here."""
    custom = tuple(op.key for op in manifest.custom_ops)
    # A provider that hung or crashed before keeps its reason; `choose` reports it as the reason it is not used.
    found = _Candidates(
        {p: Availability.yes() for p in candidates if p in poisoned},
        {p: Measurement(p, error=poisoned[p]) for p in candidates if p in poisoned},
        {},
    )
    # A provider whose runtime cannot load this bundle's format at all is decided here, without a probe or a worker.
    found.availability.update(misfits([p for p in candidates if p not in poisoned], manifest))
    fresh = [p for p in candidates if p not in poisoned and p not in found.availability]
    if policy.measure_in_worker and len(fresh) > 1:
        # imported here: an agent that loads a cached decision never carries the worker's job schema (~0.5 MB)
        from edgefleet.agent.runtime.selection.worker import measure_in_worker

        early = EarlyLoads(lambda p: _load(p, model_path, options, golden, manifest, policy, cache, key))
        try:
            result = measure_in_worker(
                fresh,
                manifest_json=manifest.model_dump_json(),
                model_path=model_path,
                golden=golden,
                bundle_dir=options.bundle_dir,
                cache_dir=options.cache_dir,
                threads=options.threads,
                custom_op_libraries=options.custom_op_libraries,
                custom_op_config=custom_ops.configuration(),
                policy=policy,
                cache=cache,
                key=key,
                stop_when_clear=True,
                on_passed=early.passed_in_worker,
            )
        except WorkerUnavailable as err:
            early.discard()
            log.warning("%s; measuring the candidates in the agent's own process", err)
        else:
            found.availability.update(result.availability)
            found.measurements.update(result.measurements)
            for provider, trial in early.finish().items():  # loaded here while the worker measured the rest
                verdict = found.measurements[provider].golden
                if verdict is not None and verdict.passed and trial.session is not None:
                    found.trials[provider] = trial
                elif trial.session is not None:
                    trial.session.close()
            return found
    for provider in fresh:
        avail = found.availability[provider] = backends.availability(provider, manifest.format, custom_ops=custom)
        if not avail.ok:
            continue
        trial = _load(provider, model_path, options, golden, manifest, policy, cache, key)
        found.measurements[provider] = trial.measurement
        if trial.session is not None:
            found.trials[provider] = trial
    passing = {
        p: t for p, t in found.trials.items() if t.measurement.golden is not None and t.measurement.golden.passed
    }
    if len(passing) > 1:
        medians = time_interleaved(
            {p: t.session for p, t in passing.items() if t.session},
            list(golden.inputs.samples()),
            timing_calls(policy, {p: t.call_s for p, t in passing.items()}),
            policy.rounds,
            clear_margin=policy.tie_margin,
        )
        for provider, median in medians.items():
            before = found.measurements[provider]
            found.measurements[provider] = Measurement(
                provider, golden=before.golden, median_ms=median, load_ms=before.load_ms
            )
    return found


__all__ = [
    "CACHE_FILE",
    "DecisionCache",
    "Measurement",
    "NoProviderError",
    "Policy",
    "ProviderChoice",
    "Selected",
    "abandoned_loads",
    "choose",
    "decision_key",
    "hardware_fingerprint",
    "model_identity",
    "select",
    "time_interleaved",
]
