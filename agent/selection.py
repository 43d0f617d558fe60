"""Choosing the execution provider by measurement.

`choose` is a pure function of (the providers the bundle allows, what is available here and why not,
what was measured, the agent's policy) → the choice and, for every other provider, why it was not
chosen. `select` is the I/O around it: load each available candidate (time-bounded), run the golden
inputs, drop those whose outputs leave the bundle's tolerance, time the rest in interleaved rounds
(medians), choose, and cache the decision in a JSON file keyed by bundle, hardware, runtime versions and
policy, so that a restart loads only the winner and a runtime upgrade measures again.

A load that hangs is abandoned after `load_timeout_s`: ONNX Runtime is asked to cancel (its load
cancellation flag); OpenVINO has no such call, so its thread is left behind (a daemon thread; it cannot
be killed from Python) and the provider is recorded as hung for this key, so it is not tried again
until a runtime version changes. A native call that crashes the process, or hangs holding the GIL until
the service manager's watchdog restarts the agent, is caught by a journal: each load is written to
`selection-inflight-*.json` before it starts and removed after; a journal left by a dead process marks
that provider as crashed for that key at the next start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent import backends
from edgefleet.agent.backends import Availability, CancelToken, LoadOptions, Session
from edgefleet.agent.store import atomic_write
from edgefleet.core.errors import BundleError
from edgefleet.core.golden import GoldenResult, GoldenSet, compare
from edgefleet.core.manifest import Manifest
from edgefleet.core.tensors import run_samples

log = logging.getLogger(__name__)

CACHE_FILE = "selection.json"
CACHE_SCHEMA_VERSION = 1
_MAX_CACHED = 64


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


# --- the I/O around `choose`


def hardware_fingerprint() -> dict[str, str]:
    """What the decision depends on besides software: CPU model, core count, accelerator device nodes."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    nodes = sorted(glob("/dev/dri/renderD*") + glob("/dev/accel/accel*") + glob("/dev/nvidia[0-9]*"))
    return {
        "arch": platform.machine(),
        "os": platform.system().lower(),
        "cpu": cpu,
        "cpus": str(os.cpu_count() or 1),
        "accelerators": ",".join(nodes),
    }


def decision_key(manifest: Manifest, threads: int, policy: Policy) -> tuple[str, dict[str, Any]]:
    """(a short hash, what it hashes): bundle, hardware, each provider's runtime versions, threads, policy.

    Computed without importing any optional runtime (versions come from package metadata), so that a
    restart with a cached decision loads only the winner's runtime. A new accelerator shows up in the
    hardware part (device nodes), a new or upgraded package in the versions.
    """
    parts: dict[str, Any] = {
        "bundle_id": manifest.bundle_id,
        "hardware": hardware_fingerprint(),
        "runtimes": backends.runtime_versions(manifest.providers),
        "threads": threads,
        "policy": policy.model_dump(include={"prefer", "exclude", "tie_margin"}),
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]
    return digest, parts


def model_identity(manifest: Manifest) -> str:
    """sha256 of the model artifact: its file's, or for a directory (an .mlpackage) a hash over its files'."""
    prefix = manifest.model_path.rstrip("/") + "/"
    for entry in manifest.files:
        if entry.path == manifest.model_path:
            return entry.sha256
    inside = sorted(f"{e.path}:{e.sha256}" for e in manifest.files if e.path.startswith(prefix))
    return hashlib.sha256("\n".join(inside).encode()).hexdigest() if inside else ""


class DecisionCache:
    """`selection.json` in the agent's cache folder: decisions and providers that hung or crashed, by key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / CACHE_FILE
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("provider decision cache %s is unreadable (%s); measuring again", self.path, err)
            return {}
        if not isinstance(data, dict) or data.get("schema_version") != CACHE_SCHEMA_VERSION:
            return {}
        entries = data.get("decisions")
        return entries if isinstance(entries, dict) else {}

    def _write(self, entries: dict[str, Any]) -> None:
        newest = sorted(entries.items(), key=lambda kv: kv[1].get("updated_at", 0), reverse=True)[:_MAX_CACHED]
        self.folder.mkdir(parents=True, exist_ok=True)
        body = {"schema_version": CACHE_SCHEMA_VERSION, "decisions": dict(newest)}
        atomic_write(self.path, json.dumps(body, indent=2, sort_keys=True).encode())

    def get(self, key: str) -> dict[str, Any]:
        with self._lock:
            entry = self._read().get(key)
            return entry if isinstance(entry, dict) else {}

    def update(self, key: str, **values: Any) -> None:
        with self._lock:
            entries = self._read()
            entry = _entry(entries, key)
            entry.update(values, updated_at=time.time())
            entries[key] = entry
            self._write(entries)

    def poison(self, key: str, provider: str, reason: str) -> None:
        with self._lock:
            entries = self._read()
            entry = _entry(entries, key)
            entry.setdefault("poisoned", {})[provider] = reason
            entry.pop("provider", None)  # a decision that includes a crashing provider is void
            entry["updated_at"] = time.time()
            entries[key] = entry
            self._write(entries)

    def forget_decision(self, key: str) -> None:
        with self._lock:
            entries = self._read()
            if isinstance(entries.get(key), dict):
                entries[key].pop("provider", None)
                self._write(entries)

    # --- the crash journal
    def journal(self, key: str, provider: str) -> Path:
        path = self.folder / f"selection-inflight-{key}-{hashlib.sha256(provider.encode()).hexdigest()[:8]}.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(
            path, json.dumps({"key": key, "provider": provider, "pid": os.getpid(), "at": time.time()}).encode()
        )
        return path

    def recover_journals(self) -> list[tuple[str, str]]:
        """Journals left by a process that died while loading: poison those providers. Returns (key, provider)."""
        found: list[tuple[str, str]] = []
        for path in self.folder.glob("selection-inflight-*.json"):
            try:
                record = json.loads(path.read_text())
                key, provider, pid, at = record["key"], record["provider"], int(record["pid"]), float(record["at"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if pid == os.getpid() or (psutil.pid_exists(pid) and _is_python(pid)):
                continue  # a load in flight in this (or another live) agent
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            self.poison(
                key,
                provider,
                f"crashed or hung the agent while loading (at {when}); not tried again until a runtime version changes",
            )
            path.unlink(missing_ok=True)
            found.append((key, provider))
        return found


def _entry(entries: dict[str, Any], key: str) -> dict[str, Any]:
    found = entries.get(key)
    return found if isinstance(found, dict) else {}


def _is_python(pid: int) -> bool:
    try:
        return "python" in psutil.Process(pid).name().lower()
    except psutil.Error:
        return False


_ABANDONED: list[tuple[str, threading.Thread]] = []


def abandoned_loads() -> list[str]:
    """Providers whose load was abandoned after a timeout and whose thread is still stuck."""
    return [provider for provider, thread in _ABANDONED if thread.is_alive()]


@dataclass
class _Trial:
    measurement: Measurement
    session: Session | None = None
    call_s: float = 0.0  # per-call time seen on the golden run (to size timing rounds)


def _try(
    provider: str,
    model_path: Path,
    options: LoadOptions,
    golden: GoldenSet,
    manifest: Manifest,
    timeout_s: float,
    cache: DecisionCache | None,
    key: str,
    engine_timeout_s: float = 0.0,
) -> _Trial:
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
            box["golden"] = compare(outputs, golden, manifest.golden)
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
        return _Trial(Measurement(provider, error=reason))
    if "error" in box:
        err = box["error"]
        if "session" in box:
            box["session"].close()
        return _Trial(Measurement(provider, error=f"failed: {err}", load_ms=box.get("load_ms")))
    return _Trial(
        Measurement(provider, golden=box["golden"], load_ms=box["load_ms"]), box["session"], box.get("call_s", 0.0)
    )


def time_interleaved(
    sessions: Mapping[str, Session], samples: Sequence[dict[str, np.ndarray]], calls: Mapping[str, int], rounds: int
) -> dict[str, float]:
    """Median per-call milliseconds: each round runs every session once in a rotating order."""
    names = list(sessions)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            run, count = sessions[name].run, calls[name]
            start = time.perf_counter()
            for call in range(count):
                run(samples[call % len(samples)])
            per_round[name].append((time.perf_counter() - start) * 1000 / count)
    return {name: float(np.median(values)) for name, values in per_round.items()}


@dataclass
class Selected:
    session: Session
    choice: ProviderChoice
    golden: GoldenResult


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
    policy = policy or Policy()
    options = LoadOptions(
        threads=threads,
        precision=manifest.recipe.precision,
        cache_dir=cache_dir,
        outputs=tuple(o.name for o in manifest.outputs),
        model_sha256=model_identity(manifest),
        bundle_dir=bundle_dir,
        tensorrt=manifest.tensorrt,
        custom_op_libraries=tuple(custom_op_libraries),
    )
    custom = tuple(op.key for op in manifest.custom_ops)
    allowed = list(dict.fromkeys(manifest.providers))
    key, parts = decision_key(manifest, threads, policy)
    cache = DecisionCache(cache_dir) if cache_dir is not None else None
    if cache is not None:
        for stale_key, provider in cache.recover_journals():
            log.error("provider %s crashed or hung an earlier agent while loading (decision %s)", provider, stale_key)
    entry = cache.get(key) if cache else {}
    poisoned: dict[str, str] = dict(entry.get("poisoned", {}))

    cached = entry.get("provider")
    if (
        cache is not None
        and isinstance(cached, str)
        and cached in allowed
        and cached not in policy.exclude
        and backends.availability(cached, manifest.format, custom_ops=custom).ok
    ):
        trial = _try(
            cached, model_path, options, golden, manifest, policy.load_timeout_s, cache, key,
            policy.engine_build_timeout_s,
        )  # fmt: skip
        if trial.session is not None and trial.measurement.golden is not None and trial.measurement.golden.passed:
            stored = dict(entry.get("reasons", {}))
            choice = ProviderChoice(
                cached,
                {p: stored[p] for p in allowed if p in stored},
                str(entry.get("summary", "")),
                dict(entry.get("medians_ms", {})),
                cached=True,
            )
            return Selected(trial.session, choice, trial.measurement.golden)
        if trial.session is not None:
            trial.session.close()
        log.warning("cached choice %s no longer checks out (%s); measuring again", cached, trial.measurement)
        cache.forget_decision(key)
        poisoned = dict(cache.get(key).get("poisoned", {}))

    availability = {
        p: backends.availability(p, manifest.format, custom_ops=custom) for p in allowed if p not in policy.exclude
    }
    measurements: dict[str, Measurement] = {}
    trials: dict[str, _Trial] = {}
    for provider, avail in availability.items():
        if not avail.ok:
            continue
        if provider in poisoned:
            measurements[provider] = Measurement(provider, error=poisoned[provider])
            continue
        trial = _try(
            provider, model_path, options, golden, manifest, policy.load_timeout_s, cache, key,
            policy.engine_build_timeout_s,
        )  # fmt: skip
        measurements[provider] = trial.measurement
        if trial.session is not None:
            trials[provider] = trial
    passing = {p: t for p, t in trials.items() if t.measurement.golden is not None and t.measurement.golden.passed}
    if len(passing) > 1:
        budget_per_call = policy.measure_budget_s / (policy.rounds * len(passing))
        calls = {p: int(min(200, max(1, budget_per_call / max(t.call_s, 1e-6)))) for p, t in passing.items()}
        samples = list(golden.inputs.samples())
        medians = time_interleaved(
            {p: t.session for p, t in passing.items() if t.session}, samples, calls, policy.rounds
        )
        for provider, median in medians.items():
            measurements[provider] = Measurement(
                provider,
                golden=measurements[provider].golden,
                median_ms=median,
                load_ms=measurements[provider].load_ms,
            )
    try:
        choice = choose(allowed, availability, measurements, policy)
    except NoProviderError:
        for trial in trials.values():
            if trial.session is not None:
                trial.session.close()
        raise
    for provider, trial in trials.items():
        if provider != choice.provider and trial.session is not None:
            trial.session.close()
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
            bundle_id=manifest.bundle_id,
            parts=parts,
        )
    chosen = trials[choice.provider]
    assert chosen.session is not None and chosen.measurement.golden is not None  # passing is a precondition
    return Selected(chosen.session, choice, chosen.measurement.golden)


__all__ = [
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
