"""Measuring provider candidates in a separate, time-bounded worker process.

A runtime that was measured but not chosen would otherwise stay mapped in the agent for good (OpenVINO: about
90 MB), and a load that hangs inside native code could only be abandoned, never stopped. So the agent hands the
candidates to `python -m edgefleet.agent.runtime.selection.worker`: the worker checks each provider's availability,
loads it, runs the golden inputs, times the ones that pass in interleaved rounds, and reports on stdout, one JSON
line per step. The agent keeps the figures, chooses, and loads only the winner itself.

The worker process itself (started ahead of its job when the agent accepts an offer) is selection_process.py.

The agent gives each step a deadline. A worker that misses one, or dies, is killed; the provider it was loading
is recorded as hung or crashed (not tried again until a runtime version changes), and a new worker measures the
rest. Nothing the worker does can take the agent down.
"""

from __future__ import annotations

import json
import logging
import os
import select
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from edgefleet.agent.runtime.backends import Availability
from edgefleet.agent.runtime.selection import process as selection_process
from edgefleet.agent.runtime.selection.cache import DecisionCache
from edgefleet.agent.runtime.selection.policy import Measurement, Policy
from edgefleet.agent.runtime.selection.process import IDLE_EXIT_S, WorkerUnavailable
from edgefleet.core.quality.golden import GoldenResult, GoldenSet

log = logging.getLogger(__name__)

__all__ = ["WorkerJob", "WorkerResult", "WorkerUnavailable", "measure_in_worker", "single_call_percentiles"]

_START_GRACE_S = 60.0  # starting Python and importing the runtimes, on a loaded device
_STEP_GRACE_S = 5.0  # beyond the load's own limit, for the worker to report it


class WorkerJob(BaseModel):
    """What the agent asks of a worker (JSON on its stdin)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_json: str
    model_path: str
    golden_path: str
    bundle_dir: str | None
    cache_dir: str | None
    threads: int
    custom_op_libraries: list[str]
    custom_op_packages: list[str]
    custom_op_library_dirs: list[str]
    providers: list[str]
    policy: Policy
    percentile_calls: int = 0  # > 0: also time this many single calls of each passing provider (percentiles)
    cpu_cores: list[int] | None = None  # pin the worker to these cores, at a lower priority (a CPU share)
    stop_when_clear: bool = False  # end the timing rounds early once one provider is clearly the fastest


@dataclass
class WorkerResult:
    availability: dict[str, Availability] = field(default_factory=dict)
    measurements: dict[str, Measurement] = field(default_factory=dict)
    hung: list[str] = field(default_factory=list)  # providers whose load the worker abandoned
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)  # provider -> p50/p90/p99 ms
    peak_rss_mb: float | None = None  # the last worker's peak resident memory


def _golden(record: Mapping[str, Any] | None) -> GoldenResult | None:
    if record is None:
        return None
    return GoldenResult(
        float(record["agreement"]), float(record["max_abs_error"]), bool(record["passed"]), str(record["reason"]),
        rule=str(record.get("rule", "per-output checks")),
    )  # fmt: skip


def measure_in_worker(
    providers: Sequence[str],
    *,
    manifest_json: str,
    model_path: Path,
    golden: GoldenSet,
    bundle_dir: Path | None,
    cache_dir: Path | None,
    threads: int,
    custom_op_libraries: Sequence[str],
    custom_op_config: tuple[list[str], list[Path]],
    policy: Policy,
    cache: DecisionCache | None,
    key: str,
    percentile_calls: int = 0,
    cpu_cores: Sequence[int] | None = None,
    stop_when_clear: bool = False,
    on_passed: Callable[[str], object] | None = None,
) -> WorkerResult:
    """Availability and measurements of `providers`, taken in worker processes (see the module docstring).

    `on_passed(provider)` is called (on this thread) as soon as a worker reports that `provider` loaded and passed
    the golden set, while the worker goes on measuring the others."""
    result = WorkerResult()
    remaining = list(providers)
    with tempfile.TemporaryDirectory(prefix="edgefleet-selection-") as scratch:
        golden_path = Path(scratch) / "golden.npz"
        golden.save(golden_path)
        while remaining:
            job = WorkerJob(
                manifest_json=manifest_json,
                model_path=str(model_path),
                golden_path=str(golden_path),
                bundle_dir=str(bundle_dir) if bundle_dir else None,
                cache_dir=str(cache_dir) if cache_dir else None,
                threads=threads,
                custom_op_libraries=list(custom_op_libraries),
                custom_op_packages=list(custom_op_config[0]),
                custom_op_library_dirs=[str(d) for d in custom_op_config[1]],
                providers=remaining,
                policy=policy,
                percentile_calls=percentile_calls,
                cpu_cores=list(cpu_cores) if cpu_cores is not None else None,
                stop_when_clear=stop_when_clear,
            )
            failed = _run_one(job, result, on_passed)
            if failed is None:
                for provider in result.hung:
                    reason = result.measurements[provider].error or "hung"
                    if cache is not None:
                        cache.poison(key, provider, reason + "; not tried again until a runtime version changes")
                break
            provider, reason = failed
            result.measurements[provider] = Measurement(provider, error=reason)
            if cache is not None:
                cache.poison(key, provider, reason + "; not tried again until a runtime version changes")
            log.error("provider %s: %s", provider, reason)
            # Measure the rest again in a fresh worker: the figures of one process are compared side by side.
            remaining = [p for p in remaining if p != provider]
            for other in remaining:
                result.measurements.pop(other, None)
    return result


def _run_one(
    job: WorkerJob, result: WorkerResult, on_passed: Callable[[str], object] | None = None
) -> tuple[str, str] | None:
    """Run one worker to its end; returns (provider, reason) when it hung or died while loading `provider`."""
    worker = selection_process.start(job)
    in_flight: str | None = None
    deadline = time.monotonic() + _START_GRACE_S + job.policy.load_timeout_s
    try:
        while True:
            try:
                record = worker.next(deadline - time.monotonic())
            except TimeoutError:
                if in_flight is None:
                    raise WorkerUnavailable("the measuring worker stopped answering between loads") from None
                return (in_flight, f"hung: loading and the golden run took over {job.policy.load_timeout_s:g} s")
            if record is None:
                code = worker.proc.wait()
                if in_flight is not None:
                    return (in_flight, f"crashed the measuring worker while loading (exit code {code})")
                if code != 0:
                    raise WorkerUnavailable(f"the measuring worker exited with code {code}")
                return None
            event = record.get("event")
            provider = str(record.get("provider", ""))
            if event == "available":
                result.availability[provider] = (
                    Availability.yes(record["reason"]) if record["ok"] else Availability.no(record["reason"])
                )
            elif event == "start":
                in_flight = provider
                deadline = time.monotonic() + float(record["timeout_s"]) + _STEP_GRACE_S
            elif event == "loaded":
                in_flight = None
                if record.get("hung"):  # abandoned on a thread inside the worker: never try it again either
                    result.hung.append(provider)
                result.measurements[provider] = Measurement(
                    provider, error=record.get("error"), golden=_golden(record.get("golden")),
                    load_ms=record.get("load_ms"),
                )  # fmt: skip
                verdict = result.measurements[provider].golden
                if on_passed is not None and verdict is not None and verdict.passed and not record.get("error"):
                    on_passed(provider)
                deadline = time.monotonic() + job.policy.load_timeout_s + _STEP_GRACE_S
            elif event == "timing":
                deadline = time.monotonic() + 3 * job.policy.measure_budget_s + 2 * _STEP_GRACE_S
                if job.percentile_calls:  # single calls after the rounds: each at most the load limit
                    deadline += job.policy.load_timeout_s
            elif event == "percentiles":
                deadline = time.monotonic() + job.policy.load_timeout_s + _STEP_GRACE_S
                result.percentiles.update({k: dict(v) for k, v in dict(record["figures"]).items()})
            elif event == "done":
                result.peak_rss_mb = record.get("peak_rss_mb")
            elif event == "timed":
                for name, median in dict(record["medians_ms"]).items():
                    before = result.measurements[name]
                    result.measurements[name] = Measurement(
                        name, golden=before.golden, median_ms=float(median), load_ms=before.load_ms
                    )
    finally:
        worker.kill()


# --- the worker side


def _emit(**record: Any) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _work(job: WorkerJob) -> None:
    from edgefleet.agent.runtime import backends, custom_ops
    from edgefleet.agent.runtime.selection.trial import load_options, time_interleaved, timing_calls, try_load
    from edgefleet.core.bundle.manifest import Manifest

    _limit_cpu(job.cpu_cores)
    manifest = Manifest.model_validate_json(job.manifest_json)
    golden = GoldenSet.load(Path(job.golden_path), manifest.inputs, manifest.outputs)
    model_path, libraries = Path(job.model_path), tuple(job.custom_op_libraries)
    if manifest.custom_ops and job.bundle_dir:  # Python custom ops are registered per process
        custom_ops.configure(job.custom_op_packages, [Path(d) for d in job.custom_op_library_dirs])
        work_dir = Path(job.cache_dir or job.bundle_dir) / "custom-ops"
        prepared = custom_ops.prepare(Path(job.bundle_dir) / manifest.model_path, manifest, work_dir)
        model_path, libraries = prepared.model_path, prepared.libraries
    options = load_options(
        manifest, job.threads, Path(job.cache_dir) if job.cache_dir else None,
        Path(job.bundle_dir) if job.bundle_dir else None, libraries,
    )  # fmt: skip
    custom = tuple(op.key for op in manifest.custom_ops)
    policy = job.policy
    trials = {}
    for provider in job.providers:
        avail = backends.availability(provider, manifest.format, custom_ops=custom)
        _emit(event="available", provider=provider, ok=avail.ok, reason=avail.reason)
        if not avail.ok:
            continue
        backend = backends.backend_for(provider)
        timeout = policy.load_timeout_s
        if backend.compiles_on_load(provider, options):
            timeout = max(timeout, policy.engine_build_timeout_s)
        _emit(event="start", provider=provider, timeout_s=timeout)
        trial = try_load(provider, model_path, options, golden, manifest, timeout, None, "")
        measured = trial.measurement
        verdict = None
        if measured.golden is not None:
            g = measured.golden  # the agent checks the winner's golden set again: these fields are what `choose` reads
            verdict = dict(
                agreement=g.agreement, max_abs_error=g.max_abs_error, passed=g.passed, reason=g.reason, rule=g.rule
            )
        _emit(
            event="loaded", provider=provider, error=measured.error, golden=verdict, load_ms=measured.load_ms,
            hung=trial.hung,
        )  # fmt: skip
        if trial.session is not None and measured.golden is not None and measured.golden.passed:
            trials[provider] = trial
    if trials and (len(trials) > 1 or job.percentile_calls):
        _emit(event="timing")
    if len(trials) > 1:
        medians = time_interleaved(
            {p: t.session for p, t in trials.items() if t.session},
            list(golden.inputs.samples()),
            timing_calls(policy, {p: t.call_s for p, t in trials.items()}),
            policy.rounds,
            clear_margin=policy.tie_margin if job.stop_when_clear else None,
        )
        _emit(event="timed", medians_ms=medians)
    if job.percentile_calls and trials:
        _emit(event="percentiles", figures=single_call_percentiles(trials, golden, job.percentile_calls))
    _emit(event="done", peak_rss_mb=_peak_rss_mb())


def single_call_percentiles(trials: Mapping[str, Any], golden: GoldenSet, calls: int) -> dict[str, dict[str, float]]:
    """p50/p90/p99 of single calls, the providers taking turns call by call (so a noisy moment hits them alike)."""
    import numpy as np

    samples = list(golden.inputs.samples())
    times: dict[str, list[float]] = {p: [] for p in trials}
    for call in range(calls):
        for provider, trial in trials.items():
            start = time.perf_counter()
            trial.session.run(samples[call % len(samples)])
            times[provider].append((time.perf_counter() - start) * 1000)
    return {p: {f"p{q}_ms": float(np.percentile(values, q)) for q in (50, 90, 99)} for p, values in times.items()}


def _peak_rss_mb() -> float | None:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except (ImportError, OSError):
        return None


def _limit_cpu(cores: Sequence[int] | None) -> None:
    if cores is None:
        return
    try:
        os.sched_setaffinity(0, set(cores))
        os.nice(10)
    except (AttributeError, OSError) as err:  # not Linux, or not allowed: measure anyway, and say so
        log.warning("cannot limit the measuring worker to cores %s: %s", list(cores), err)


def _prepare(preload: Sequence[str]) -> None:
    """Import what measuring needs, and the runtimes of `preload`, before the job is there (selection_process)."""
    from edgefleet.agent.runtime import backends, custom_ops  # noqa: F401 - imported ahead of the job
    from edgefleet.agent.runtime.selection import trial as selection_trial  # noqa: F401 - imported ahead of the job

    backends.backends()
    for provider in preload:
        try:
            backends.backend_for(provider).availability(provider)  # imports its runtime; the job checks it again
        except Exception as err:  # the job meets it again and reports it
            log.warning("preloading %s: %s", provider, err)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = sys.argv[1:]
    _prepare(args[1].split(",") if args[:1] == ["--preload"] and len(args) > 1 else [])
    _emit(event="ready")
    try:
        waiting, _, _ = select.select([sys.stdin], [], [], IDLE_EXIT_S)
    except (OSError, ValueError):  # stdin that cannot be polled: read it as it comes
        waiting = [sys.stdin]
    if not waiting:  # prestarted, and no selection took it
        os._exit(0)
    job = WorkerJob.model_validate_json(sys.stdin.buffer.read())
    _work(job)
    sys.stdout.flush()
    os._exit(0)  # a load abandoned on a stuck thread must not keep the worker alive


if __name__ == "__main__":
    main()
