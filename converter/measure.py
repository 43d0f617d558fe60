"""Measuring candidates on this machine: outputs on a dataset, accuracy, and interleaved latency.

Latency rounds are interleaved (A, B, C, A, B, C, ...) so a noisy neighbour slows every candidate
alike, and we report medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgefleet.core.errors import ConversionError
from edgefleet.core.golden import argmax_agreement
from edgefleet.core.tensors import Dataset, run_samples

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def ort_runner(model: Path, threads: int = 1) -> Runner:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped exceptions
        raise ConversionError(f"onnxruntime cannot load {model.name}: {err}") from err
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return run


def predict(runner: Runner, dataset: Dataset) -> dict[str, np.ndarray]:
    return run_samples(runner, dataset)


@dataclass(frozen=True)
class Score:
    metric: str
    value: float


def score(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], labels: np.ndarray | None) -> Score:
    """Top-1 against labels when we have them, else argmax agreement with the FP32 reference."""
    first = next(iter(reference))
    got = outputs[first]
    if labels is not None:
        predicted = got.reshape(len(got), -1).argmax(axis=1)
        return Score("top1", float(np.mean(predicted == labels)))
    return Score("argmax-agreement", argmax_agreement(got, reference[first]))


@dataclass(frozen=True)
class LatencyStats:
    median_ms: float
    p90_ms: float
    runs: int


def interleaved_latency(
    runners: Mapping[str, Runner], dataset: Dataset, *, rounds: int = 7, runs_per_round: int = 30, warmup: int = 10
) -> dict[str, LatencyStats]:
    """Median per-inference latency of each runner, measured in interleaved rounds on the same samples."""
    samples = [dataset.sample(i % len(dataset)) for i in range(runs_per_round)]
    for run in runners.values():
        for feeds in samples[:warmup]:
            run(feeds)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            for feeds in samples:
                start = time.perf_counter()
                run(feeds)
                times[name].append((time.perf_counter() - start) * 1000.0)
    return {
        name: LatencyStats(
            median_ms=statistics.median(values),
            p90_ms=float(np.percentile(values, 90)),
            runs=len(values),
        )
        for name, values in times.items()
    }
