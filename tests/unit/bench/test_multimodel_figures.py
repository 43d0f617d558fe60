"""bench/multimodel.py's arithmetic: the agent's telemetry windows of one mode pooled into one figure per slot, the
modes' order rotated across rounds, and the medians over rounds taken key by key."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from support.paths import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_multimodel", REPO / "bench" / "multimodel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_multimodel"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def test_windows_pool_into_the_total_count_and_count_weighted_percentiles() -> None:
    windows = [
        {"count": 10, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0},
        None,  # a window without scheduling figures
        {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None},
        {"count": 30, "p50_ms": 3.0, "p95_ms": 6.0, "p99_ms": 9.0},
    ]
    pooled = bench.pool(windows)
    assert pooled == {"count": 40, "p50_ms": pytest.approx(2.5), "p95_ms": pytest.approx(5.0), "p95_max_ms": 6.0}


def test_windows_without_samples_pool_into_no_figure() -> None:
    assert bench.pool([None, {"count": 0, "p50_ms": None, "p95_ms": None}]) is None


def test_each_round_starts_with_another_mode_and_runs_every_mode_once() -> None:
    orders = [bench.rotated(bench.MODES, r) for r in range(len(bench.MODES))]
    assert len({order[0].name for order in orders}) == len(bench.MODES)
    assert all(sorted(m.name for m in order) == sorted(m.name for m in bench.MODES) for order in orders)


def test_the_medians_over_rounds_are_taken_key_by_key_through_nested_figures() -> None:
    rounds = [
        {"detector": {"p95_ms": 10.0, "requests": 5}, "note": "a"},
        {"detector": {"p95_ms": 30.0, "requests": 7}, "note": "b"},
        {"detector": {"p95_ms": 20.0, "requests": 6}, "note": "c"},
    ]
    assert bench.median_of(rounds) == {"detector": {"p95_ms": 20.0, "requests": 6.0}, "note": "a"}


def test_the_scheduled_classes_are_the_issues_and_naive_puts_every_slot_in_one_class() -> None:
    assert bench.SCHEDULED == {"detector": "real-time", "lm": "interactive", "burst": "batch"}
    assert set(bench.NAIVE.values()) == {"interactive"} and set(bench.NAIVE) == set(bench.SCHEDULED)
