"""Trying candidates in the agent's own process: a time-bounded load plus golden run on a worker thread, and
interleaved timing rounds. A load that hangs is abandoned after its time limit: ONNX Runtime is asked to cancel
(its load cancellation flag); OpenVINO has no such call, so its thread is left behind (a daemon thread; it cannot
be killed from Python) and the provider is recorded as hung for this key. A native call that crashes the process
is caught by the decision cache's journal at the next start."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.runtime import backends
from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, Session
from edgefleet.agent.runtime.selection.cache import DecisionCache, model_identity
from edgefleet.agent.runtime.selection.policy import Measurement, Policy
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.quality.golden import GoldenSet, compare
from edgefleet.core.tensors import run_samples

log = logging.getLogger(__name__)


_ABANDONED: list[tuple[str, threading.Thread]] = []


def abandoned_loads() -> list[str]:
    """Providers whose load was abandoned after a timeout and whose thread is still stuck."""
    return [provider for provider, thread in _ABANDONED if thread.is_alive()]


@dataclass
class Trial:
    measurement: Measurement
    session: Session | None = None
    call_s: float = 0.0  # per-call time seen on the golden run (to size timing rounds)
    hung: bool = False  # abandoned after its time limit


def try_load(
    provider: str,
    model_path: Path,
    options: LoadOptions,
    golden: GoldenSet,
    manifest: Manifest,
    timeout_s: float,
    cache: DecisionCache | None,
    key: str,
    engine_timeout_s: float = 0.0,
) -> Trial:
    """Load `provider` and run the golden inputs on a worker thread; give up after `timeout_s`."""
    backend = backends.backend_for(provider)
    cancel = CancelToken()
    box: dict[str, Any] = {}
    done = threading.Event()
    if backend.compiles_on_load(provider, options):
        log.info("%s builds its engine on this load (nothing cached for this key yet)", provider)
        timeout_s = max(timeout_s, engine_timeout_s)

    def work() -> None:
        start = time.perf_counter()
        try:
            session = backend.load(model_path, provider, options, cancel)
            box["session"] = session
            box["load_ms"] = (time.perf_counter() - start) * 1000
            first = golden.inputs.sample(0)
            session.run(first)  # warm-up: first calls allocate and compile kernels
            session.run(first)
            begin = time.perf_counter()
            outputs = run_samples(session.run, golden.inputs)
            box["call_s"] = (time.perf_counter() - begin) / max(1, len(golden.inputs))
            box["golden"] = compare(outputs, golden, manifest.golden, manifest.search)
        except Exception as err:  # any failure of an optional runtime disables this candidate only
            box["error"] = err
        finally:
            done.set()
            if cancel.cancelled and "session" in box:  # arrived after we gave up on it
                box["session"].close()

    journal = cache.journal(key, provider) if cache else None
    thread = threading.Thread(target=work, name=f"load {provider}", daemon=True)
    thread.start()
    finished = done.wait(timeout_s)
    if not finished:
        cancel.cancel()
        _ABANDONED.append((provider, thread))
        reason = f"hung: loading and the golden run took over {timeout_s:g} s; skipped"
        log.error("%s: %s (its thread is left behind)", provider, reason)
        if cache:
            cache.poison(key, provider, reason + "; not tried again until a runtime version changes")
    if journal is not None:
        journal.unlink(missing_ok=True)
    if not finished:
        return Trial(Measurement(provider, error=reason), hung=True)
    if "error" in box:
        err = box["error"]
        if "session" in box:
            box["session"].close()
        return Trial(Measurement(provider, error=f"failed: {err}", load_ms=box.get("load_ms")))
    return Trial(
        Measurement(provider, golden=box["golden"], load_ms=box["load_ms"]), box["session"], box.get("call_s", 0.0)
    )


CLEAR_AFTER_ROUNDS = 3  # the fewest rounds that can end the timing early (clear_margin)


def time_interleaved(
    sessions: Mapping[str, Session],
    samples: Sequence[dict[str, np.ndarray]],
    calls: Mapping[str, int],
    rounds: int,
    clear_margin: float | None = None,
) -> dict[str, float]:
    """Median per-call milliseconds: each round runs every session once in a rotating order.

    With `clear_margin`, the timing ends after CLEAR_AFTER_ROUNDS (or any later) round once the decision is clear:
    every round of one session was faster, by more than the margin, than every round of each other session."""
    names = list(sessions)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            run, count = sessions[name].run, calls[name]
            start = time.perf_counter()
            for call in range(count):
                run(samples[call % len(samples)])
            per_round[name].append((time.perf_counter() - start) * 1000 / count)
        if clear_margin is not None and index + 1 >= CLEAR_AFTER_ROUNDS and clear_leader(per_round, clear_margin):
            break
    return {name: float(np.median(values)) for name, values in per_round.items()}


def clear_leader(per_round: Mapping[str, Sequence[float]], margin: float) -> str | None:
    """The session whose slowest round beat every other session's fastest round by more than `margin`, if any.
    Pure: no clock."""
    if len(per_round) < 2:
        return None
    leader = min(per_round, key=lambda name: max(per_round[name]))
    slowest = max(per_round[leader])
    others = (min(values) for name, values in per_round.items() if name != leader)
    return leader if all(slowest * (1 + margin) < fastest for fastest in others) else None


def timing_calls(policy: Policy, call_s: Mapping[str, float]) -> dict[str, int]:
    """Calls per round for each candidate, so that all rounds together fit the policy's timing budget."""
    budget_per_call = policy.measure_budget_s / (policy.rounds * max(1, len(call_s)))
    return {p: int(min(200, max(1, budget_per_call / max(s, 1e-6)))) for p, s in call_s.items()}


def load_options(
    manifest: Manifest, threads: int, cache_dir: Path | None, bundle_dir: Path | None, libraries: Sequence[str]
) -> LoadOptions:
    """How every candidate of `manifest` is loaded (the same in the agent and in a measuring worker)."""
    passes = manifest.recipe.passes
    return LoadOptions(
        threads=threads,
        precision=manifest.recipe.precision,
        pin_f32=any(p.name == "openvino-ir" and p.params.get("inference_precision_hint") == "f32" for p in passes),
        cache_dir=cache_dir,
        outputs=tuple(o.name for o in manifest.outputs),
        model_sha256=model_identity(manifest),
        bundle_dir=bundle_dir,
        tensorrt=manifest.tensorrt,
        custom_op_libraries=tuple(libraries),
    )
