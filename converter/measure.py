"""Running candidates on this machine: runners for ONNX Runtime and OpenVINO, outputs on a dataset, and
interleaved latency.

Latency rounds are interleaved (A, B, C, A, B, C, ...) so a noisy neighbour slows every candidate alike, and we
report medians. Each runner does what a serving loop does per request (copy inputs in, run, copy outputs out),
so runtimes are compared on equal terms.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort

from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset, run_samples

if TYPE_CHECKING:
    from edgefleet.converter.passes.openvino import OpenVINOArtifact

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _session_options(threads: int, as_written: bool = False) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if as_written:  # no fusions: Q/DQ nodes stay, so int8 arithmetic is the graph's, not this CPU's kernels'
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def ort_runner(
    model: Path | onnx.ModelProto, threads: int = 1, provider: str = "CPUExecutionProvider", *, as_written: bool = False
) -> Runner:
    """`as_written` runs the graph without fusions: the reference arithmetic of a quantized graph, for a host
    that stands in for other hardware (see Spec.as_written)."""
    source: str | bytes = str(model) if isinstance(model, Path) else model.SerializeToString()
    try:
        session = ort.InferenceSession(source, _session_options(threads, as_written), providers=[provider])
    except Exception as err:  # onnxruntime raises its own untyped exceptions
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if "is not a registered function/op" not in first:
            raise ConversionError(f"onnxruntime cannot load the model: {first}") from err
        session = _custom_op_session(model, threads, provider, as_written)
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A sample of a 0-d input is a numpy scalar, which onnxruntime refuses: hand it an array.
        arrays = {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in feeds.items()}
        return dict(zip(names, session.run(names, arrays), strict=True))

    return run


def _custom_op_session(
    model: Path | onnx.ModelProto, threads: int, provider: str, as_written: bool = False
) -> ort.InferenceSession:
    """A session for a model holding custom ops, with their implementations from the custom-op packages. A file
    with external data is run from its path (a renamed copy beside its data, removed once the session holds it)."""
    from edgefleet.converter.passes.custom_ops import host_session_path, host_session_source
    from edgefleet.core.custom_op_copy import external_locations

    with tempfile.TemporaryDirectory(prefix="edgefleet-custom-ops-") as work:
        if isinstance(model, Path) and external_locations(onnx.load(str(model), load_external_data=False)):
            source: str | bytes
            source, libraries = host_session_path(model, Path(work))
        else:
            source, libraries = host_session_source(onnx.load(str(model)) if isinstance(model, Path) else model)
        options = _session_options(threads, as_written)
        for library in libraries:
            options.register_custom_ops_library(library)
        try:
            return ort.InferenceSession(source, options, providers=[provider])
        except Exception as err:  # onnxruntime raises its own untyped exceptions
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise ConversionError(f"onnxruntime cannot load the model with its custom ops: {first}") from err


@cache
def openvino_devices() -> tuple[str, ...]:
    try:
        import openvino as ov
    except ImportError:
        return ()
    return tuple(ov.Core().available_devices)


def openvino_config(hint: str | None, threads: int, device: str = "CPU") -> dict[str, object]:
    """What the agent must pass to compile_model: the recorded precision hint, latency mode, threads."""
    config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
    if device == "CPU":
        config.update({"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads})
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    return config


def openvino_runner(
    artifact: OpenVINOArtifact, output_names: list[str], threads: int = 1, device: str = "CPU"
) -> Runner:
    """Compile on `device` with the artifact's precision hint (CPU proxies may override it to f32)."""
    import openvino as ov

    hint = artifact.inference_precision_hint if device != "CPU" or artifact.inference_precision_hint != "f16" else "f32"
    try:
        compiled = ov.Core().compile_model(artifact.model, device, openvino_config(hint, threads, device))
    except Exception as err:  # OpenVINO raises RuntimeError with a long report
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"OpenVINO cannot compile the model for {device}: {first}") from err
    request = compiled.create_infer_request()
    if len(compiled.outputs) != len(output_names):
        raise ConversionError(f"OpenVINO model has {len(compiled.outputs)} outputs, ONNX had {len(output_names)}")
    static = all(not port.get_partial_shape().is_dynamic for port in compiled.inputs)
    inputs = {port.get_any_name(): index for index, port in enumerate(compiled.inputs)}
    outputs = [request.get_output_tensor(i) for i in range(len(output_names))] if static else []
    in_tensors = {name: request.get_input_tensor(i) for name, i in inputs.items()} if static else {}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if static:
            for name, value in feeds.items():
                in_tensors[name].data[...] = value
            request.infer()
            return {name: outputs[i].data.copy() for i, name in enumerate(output_names)}
        request.infer(feeds, share_inputs=True)
        return {name: request.get_output_tensor(i).data.copy() for i, name in enumerate(output_names)}

    return run


def predict(runner: Runner, dataset: Dataset) -> dict[str, np.ndarray]:
    try:
        return run_samples(runner, dataset)
    except ConversionError:
        raise
    except Exception as err:  # a runtime failing on real data is a candidate failure, not a crash
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"inference failed on the evaluation set: {first}") from err


@dataclass(frozen=True)
class LatencyStats:
    median_ms: float
    p90_ms: float
    runs: int


def interleaved_latency(
    runners: Mapping[str, Runner],
    dataset: Dataset,
    *,
    rounds: int = 7,
    runs_per_round: int = 30,
    warmup: int = 10,
    round_s: float | None = None,
    prune: Callable[[dict[str, list[float]]], Mapping[str, str]] | None = None,
    on_round: Callable[[int, int], None] | None = None,
    runtimes: Mapping[str, str] | None = None,
) -> dict[str, LatencyStats]:
    """Median per-inference latency of each runner, measured in interleaved rounds on the same samples.

    `round_s`: size each round to about that many seconds per runner (5 to `runs_per_round` runs, from the
    slowest runner's warm-up), so a slow model costs rounds × round_s, not rounds × 30 runs. `prune`: after each
    round, gets every runner's times so far and names the runners to stop timing (with why); they keep the
    figures of the rounds they ran. `runtimes` (runner → runtime): wait for the previous runner's threads only
    where the runtime changes (None: before every block).
    """
    samples = [dataset.sample(i % len(dataset)) for i in range(max(runs_per_round, warmup))]
    warm: list[float] = []
    for run in runners.values():
        for feeds in samples[:warmup]:
            start = time.perf_counter()
            run(feeds)
            warm.append((time.perf_counter() - start) * 1000.0)
    if round_s is not None and warm:
        slowest = max(statistics.median(warm[i : i + warmup]) for i in range(0, len(warm), max(1, warmup)))
        runs_per_round = max(5, min(runs_per_round, math.ceil(round_s * 1000.0 / max(slowest, 1e-3))))
    samples = samples[:runs_per_round]
    times: dict[str, list[float]] = {name: [] for name in runners}
    active = list(runners)
    previous: str | None = None
    for index in range(rounds):
        for name in active:
            run = runners[name]
            if runtime_changes(runtimes, previous, name):
                settle()  # the previous runtime's worker threads (ORT spins them after each run) go quiet first
            previous = name
            run(samples[0])  # untimed: caches and this runtime's own threads warm again
            for feeds in samples:
                start = time.perf_counter()
                run(feeds)
                times[name].append((time.perf_counter() - start) * 1000.0)
        if on_round is not None:
            on_round(index + 1, rounds)
        if prune is not None and index + 1 < rounds:
            dropped = prune({name: times[name] for name in active})
            active = [name for name in active if name not in dropped]
    return {
        name: LatencyStats(
            median_ms=statistics.median(values),
            p90_ms=float(np.percentile(values, 90)),
            runs=len(values),
        )
        for name, values in times.items()
    }


SETTLE_WINDOW_S = 0.01  # the other threads' CPU time is read over windows this long
SETTLE_IDLE = 0.05  # ... until they used less than this share of one core
SETTLE_QUIET = 2  # ... in this many windows in a row (on a loaded machine a spinning thread can miss a window)
SETTLE_MAX_S = 0.5  # never wait longer (a busy thread that is not a runtime's worker)


def runtime_changes(runtimes: Mapping[str, str] | None, previous: str | None, name: str) -> bool:
    """Whether a block of `name` after one of `previous` should wait for `settle`: always without `runtimes`; else
    only across runtimes. Within one runtime the rotated order gives every runner the same neighbours, and the
    wait costs ~0.1 s a block after a 2-thread ONNX Runtime session (its workers spin that long)."""
    if runtimes is None or previous is None:
        return True
    return runtimes.get(previous) != runtimes.get(name)


def settle(max_s: float = SETTLE_MAX_S) -> float:
    """Wait until no other thread of this process is running, at most `max_s`; returns the seconds waited.

    After a run, ONNX Runtime's intra-op workers spin for a while before they sleep (OpenVINO's briefly too); a
    runner timed meanwhile shares the cores with them (an OpenVINO model on 2 cores ran several times slower
    right after an ONNX Runtime session). Each runtime keeps its own settings, as the device runs it alone: this
    only waits for the previous runtime's threads to go quiet, read from /proc/self/task/*/schedstat (the CPU
    time of each thread). Without that file it waits a fixed 50 ms."""
    start = time.monotonic()
    me = str(threading.get_native_id())
    before, since, quiet = _others_cpu_ns(me), start, 0
    if before is None:
        time.sleep(min(max_s, 0.05))
        return time.monotonic() - start
    while time.monotonic() - start < max_s:
        time.sleep(SETTLE_WINDOW_S)
        now, at = _others_cpu_ns(me), time.monotonic()
        if now is None:
            break
        quiet = quiet + 1 if now - before < SETTLE_IDLE * (at - since) * 1e9 else 0
        if quiet >= SETTLE_QUIET:
            break
        before, since = now, at
    return time.monotonic() - start


def _others_cpu_ns(me: str) -> int | None:
    """CPU nanoseconds used so far by this process's threads other than `me` (None: not readable here)."""
    try:
        tasks = [tid for tid in os.listdir("/proc/self/task") if tid != me]
    except OSError:
        return None
    total, read = 0, 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
            read += 1
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total if read or not tasks else None
