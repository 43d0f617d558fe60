"""One definition of "good enough": the golden figures a bundle will report on the device, computed by the device's
own check, and the floor the rollout's default guardrail holds them to (edgefleet.core.quality.golden_hold)."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.control.rollout.judge.evidence import Thresholds
from edgefleet.core.bundle.manifest import GoldenHold, GoldenSpec
from edgefleet.core.quality.golden import compare
from edgefleet.core.quality.golden_hold import (
    DEFAULT_MAX_GOLDEN_DROP,
    default_max_golden_drop,
    hold,
    refusal,
    rollout_floor,
)
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.output_rules import derive_checks
from edgefleet.core.tensors import Dataset

from support.golden_sets import classifier_golden as _classifier


def test_the_figures_are_the_device_checks_own_on_the_same_outputs() -> None:
    data, spec = _classifier(flips=1)
    figures, result = hold(data.expected, data, spec, None, 0.01, runtime="onnxruntime CPUExecutionProvider")
    device = compare(data.expected, data, spec)  # what agent/runtime/model.py check_golden computes
    assert figures.agreement == pytest.approx(device.agreement, abs=1e-6) == 63 / 64
    assert figures.scores == {s.output: pytest.approx(s.score) for s in device.scores}
    assert result.passed and figures.runtime == "onnxruntime CPUExecutionProvider"


def test_the_floor_is_the_default_drop_from_fp32_widened_by_the_drop_the_build_plans() -> None:
    """The issue's example: INT8 agreeing 0.984 at build, the default drop 0.01: floor 1 - 0.01 - 0.016 → 0.98."""
    _, exact = _classifier(flips=0)
    _, one = _classifier(flips=1)
    assert rollout_floor(exact, 0.01) == pytest.approx(0.99)
    assert rollout_floor(one, 0.01) == pytest.approx(0.98)  # planned 1/64 = 0.016, allowed up to 0.01 more
    data, spec = _classifier(flips=1)
    figures, _ = hold(data.expected, data, spec, None, 0.01, runtime="onnxruntime")
    assert figures.passed and figures.floor == pytest.approx(0.98)
    assert figures.summary() == "golden agreement the rollout will hold: 0.984 ≥ floor 0.980"


def test_a_candidate_below_the_floor_is_refused_with_the_figure_the_floor_and_the_flag() -> None:
    data, spec = _classifier(flips=2)  # 0.969, the device figure
    figures, result = hold(data.expected, data, spec, None, 0.01, runtime="onnxruntime CPUExecutionProvider")
    assert result.passed  # the device's own checks pass on the build's outputs ...
    assert not figures.passed and figures.agreement == pytest.approx(62 / 64)  # ... the rollout would not
    why = refusal(figures, result.reason)
    assert "golden agreement 0.9688 on the device (onnxruntime CPUExecutionProvider)" in why
    assert "below the floor 0.9800" in why and "--max-drop" in why and "--max-golden-drop" in why
    assert figures.summary().endswith("0.969 < floor 0.980")


def test_the_default_drop_is_the_tightest_budget_that_is_a_share() -> None:
    assert default_max_golden_drop([0.02, 0.01]) == 0.01
    assert default_max_golden_drop([0.05, None]) == 0.05
    assert default_max_golden_drop([80.0]) == DEFAULT_MAX_GOLDEN_DROP  # an SQNR budget in dB is not a share
    assert default_max_golden_drop([]) is None and default_max_golden_drop([None]) is None
    assert Thresholds().max_golden_drop == DEFAULT_MAX_GOLDEN_DROP  # the rollout reads the same constant


def test_a_manifest_without_the_block_still_parses_and_the_block_is_left_out() -> None:
    figures = GoldenHold(agreement=1.0, max_drop=0.01, floor=0.99, passed=True, runtime="openvino CPU")
    assert GoldenHold.model_validate_json(figures.model_dump_json()) == figures
    assert "stand-in" not in figures.summary()
    assert "stand-in" in figures.model_copy(update={"same_runtime": False}).summary()


def test_an_embedding_judged_by_cosine_is_a_vector_on_the_device_too_not_class_scores_by_its_argmax() -> None:
    """The issue's seam: an embedding shipped by cosine on the evaluation set, judged on the device by argmax
    agreement over its entries (the rule its shape alone calls for). With the task's rule it is judged as a vector
    (cosine, SQNR, max-abs) and its golden figures meet the floor the rollout holds."""
    rng = np.random.default_rng(3)
    reference = rng.normal(0, 1, (64, 1, 128)).astype(np.float32)
    reference /= np.linalg.norm(reference, axis=-1, keepdims=True)
    build = (reference + rng.normal(0, 0.006, reference.shape)).astype(np.float32)  # an INT8 build: cosine ≈ 0.998
    data = GoldenSet(Dataset({"x": np.zeros((64, 1, 3), np.float32)}, None), {"embedding": reference},
                     {"embedding": build})  # fmt: skip
    for rules, rule in (({}, "class-agreement"), ({"embedding": "continuous"}, "continuous")):
        checks = derive_checks(data.reference, data.expected, 0.05, rules)  # type: ignore[arg-type]
        assert checks[0].rule == rule
        spec = GoldenSpec(count=64, max_abs_error=0.05, min_agreement=0.0, outputs=checks)
        agreement = compare(data.expected, data, spec).agreement
        spec = spec.model_copy(update={"min_agreement": agreement - 1 / 64})
        figures, _ = hold(data.expected, data, spec, None, 0.01, runtime="onnxruntime")
        if rule == "class-agreement":  # argmax over 128 features: samples "disagree" while the vectors agree
            assert figures.agreement < 0.98 and not figures.passed
        else:
            assert figures.agreement == 1.0 and figures.scores["embedding"] > 0.99 and figures.passed
