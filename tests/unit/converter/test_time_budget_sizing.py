"""Under --time-budget every stage is sized to the time left: the FP32 reference keeps the evaluation samples that
fit its share of the budget (every candidate is then judged on those), the timing shrinks its rounds or is not run,
and whatever was cut is recorded for the report (converter.deadline)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter import deadline
from edgefleet.converter.conversion import MIN_EVAL_SAMPLES, REFERENCE_SHARE, sized_reference
from edgefleet.converter.runners import Runner, ort_runner, predict
from edgefleet.converter.search.attempts import GOLDEN_BYTES_PER_S, PROBE_RUNS, bundle_share_s
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.search.timing import TimingFit, _left, fit_timing
from edgefleet.core.tensors import Dataset


def _linear() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


DATA = Dataset({"x": np.random.default_rng(1).normal(size=(24, 1, 8)).astype(np.float32)}, np.arange(24))


def _slow(runner: Runner, seconds: float) -> Runner:
    """The model as a busy machine runs it: each sample takes about `seconds` (a machine's load is not a fault a
    real runner can be asked for)."""

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(seconds)
        return runner(feeds)

    return run


def test_without_a_budget_the_reference_covers_every_evaluation_sample_and_nothing_is_cut() -> None:
    with deadline.recording_cuts() as cut:
        reference, evaluation = sized_reference(_slow(ort_runner(_linear()), 0.01), DATA, None)
    assert len(evaluation) == 24 and reference["y"].shape == (24, 1, 3) and not cut


def test_on_a_slow_machine_the_reference_keeps_the_samples_that_fit_its_share_and_says_so() -> None:
    budget_s, per_sample = 4.0, 0.1  # the share (0.6 s) fits about 6 of 24 samples
    runner = ort_runner(_linear())
    started = time.monotonic()
    with deadline.recording_cuts() as cut:
        reference, evaluation = sized_reference(_slow(runner, per_sample), DATA, budget_s)
    took = time.monotonic() - started
    kept = len(evaluation)
    assert MIN_EVAL_SAMPLES <= kept < 24
    assert took <= REFERENCE_SHARE * budget_s + 2 * per_sample + 1.0  # one sample past the share, and slack
    assert evaluation.labels is not None and list(evaluation.labels) == list(range(kept))
    np.testing.assert_allclose(reference["y"], predict(runner, DATA.head(kept))["y"], rtol=1e-6)
    assert [c.what for c in cut] == ["evaluation set"] and f"{kept} of 24 samples" in cut[0].how


def test_however_slow_the_machine_the_reference_keeps_the_fewest_samples() -> None:
    with deadline.recording_cuts() as cut:
        _, evaluation = sized_reference(_slow(ort_runner(_linear()), 0.05), DATA, 0.01)
    assert len(evaluation) == MIN_EVAL_SAMPLES and cut


def test_cuts_are_recorded_once_and_only_where_someone_records_them() -> None:
    deadline.cut("timing", "not run")  # nobody records: nothing happens
    with deadline.recording_cuts() as cut:
        deadline.cut("timing", "not run")
        deadline.cut("timing", "not run")
        deadline.cut("ov-bf16", "not tried")
        assert deadline.cuts() == cut
    assert cut == [deadline.Cut("timing", "not run"), deadline.Cut("ov-bf16", "not tried")]
    assert deadline.cuts() == []


USUAL = TimingFit(rounds=7, round_s=0.4, min_runs=5, warmup=10)


def test_timing_that_fits_runs_as_usual() -> None:
    assert fit_timing(USUAL, left=60.0, blocks=2, ms=10.0, fewest_rounds=1) is USUAL


def test_timing_that_does_not_fit_runs_fewer_rounds_of_one_run_within_what_is_left() -> None:
    fit = fit_timing(USUAL, left=30.0, blocks=2, ms=2000.0, fewest_rounds=1)  # 2 s a run: the usual needs minutes
    assert fit is not None and fit.min_runs == 1 and fit.warmup == 1 and 1 <= fit.rounds < USUAL.rounds
    assert fit.cost_s(2, 2000.0) <= 30.0 < TimingFit(fit.rounds + 1, 0.0, 1, 1).cost_s(2, 2000.0)


def test_timing_that_cannot_fit_its_fewest_rounds_is_not_run() -> None:
    assert fit_timing(USUAL, left=5.0, blocks=2, ms=2000.0, fewest_rounds=1) is None
    assert fit_timing(USUAL, left=30.0, blocks=2, ms=2000.0, fewest_rounds=3, extra_runs=3) is None  # a head to head


def _data(outputs: dict[str, tuple[int, ...]]) -> SearchRequest:
    evaluation = Dataset({"x": np.zeros((24, 1, 3, 32, 32), np.float32)}, None)
    reference = {name: np.zeros(shape, np.float32) for name, shape in outputs.items()}
    return cast(SearchRequest, SimpleNamespace(evaluation=evaluation, reference=reference))


def test_the_bundles_share_grows_with_its_golden_set_and_the_models_run_time() -> None:
    """u2netp: 7 maps of 320 x 320 per sample, reference and expected in the golden set; a classifier: 10 scores."""
    maps, scores = _data({f"d{i}": (24, 1, 1, 320, 320) for i in range(7)}), _data({"y": (24, 10)})
    extra = 2 * (7 * 24 * 320 * 320 - 24 * 10) * 4
    assert bundle_share_s(maps, 0.0) - bundle_share_s(scores, 0.0) == pytest.approx(extra / GOLDEN_BYTES_PER_S)
    assert bundle_share_s(scores, 0.3) - bundle_share_s(scores, 0.0) == pytest.approx(PROBE_RUNS * 0.3)  # the probe


def test_the_timing_leaves_the_bundle_its_share_of_the_budget(tmp_path: Path) -> None:
    before = time.monotonic()
    ws = Workspace(work=tmp_path, deadline=before + 30.0, finish_s=20.0)
    left = _left(ws)
    elapsed = time.monotonic() - before  # however long a loaded machine stalled between the two
    assert 10.0 - elapsed <= left <= 10.0  # 30 s to the deadline, 20 s of them the bundle's
    assert _left(Workspace(work=tmp_path)) == float("inf")
