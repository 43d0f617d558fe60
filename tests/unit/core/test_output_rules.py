"""Golden checks per output kind: the rule read from the data, tolerances from the artifact's own spread, and
continuous scores that a one-value-per-sample model can fail."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.core.bundle.manifest import GoldenSpec
from edgefleet.core.quality.golden import GoldenSet, argmax_agreement, compare
from edgefleet.core.quality.output_rules import classify, derive_check, derive_checks, explain, score
from edgefleet.core.tensors import Dataset

RNG = np.random.default_rng(7)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logits(samples: int = 64, classes: int = 10) -> np.ndarray:
    return RNG.normal(size=(samples, 1, classes)).astype(np.float32) * 3


@pytest.mark.parametrize(
    ("what", "reference", "rule"),
    [
        ("class logits (batch 1)", _logits(), "class-agreement"),
        ("class probabilities", _softmax(_logits()), "class-agreement"),
        ("predicted labels (int64, one per sample)", RNG.integers(0, 10, size=(64, 1)), "class-agreement"),
        ("token ids (int64, a sequence per sample)", RNG.integers(0, 50, size=(64, 1, 12)), "position-agreement"),
        (
            "CTC log-probabilities (time × classes)",
            np.log(_softmax(RNG.normal(size=(64, 1, 20, 30)))),
            "position-agreement",
        ),
        ("one value per sample (VAD, regression)", RNG.random((64, 1, 1)).astype(np.float32), "continuous"),
        ("a heatmap", RNG.random((64, 1, 16, 16)).astype(np.float32), "continuous"),
        ("two axes that are not distributions", RNG.normal(size=(64, 1, 8, 8)).astype(np.float32), "continuous"),
        ("a vector whose argmax never varies", np.tile(np.arange(8, dtype=np.float32), (64, 1, 1)), "continuous"),
    ],
)
def test_each_output_kind_is_classified_from_its_data(what: str, reference: np.ndarray, rule: str) -> None:
    assert classify(reference) == rule, what


def _regression_golden(bias: float = 0.0) -> tuple[GoldenSet, np.ndarray]:
    x = RNG.normal(size=(64, 1, 4)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0, 0.25], np.float32))[..., None] + 0.1  # (64, 1, 1)
    golden = GoldenSet(Dataset({"x": x}, None), reference={"y": y}, expected={"y": y})
    return golden, (y + bias).astype(np.float32)


def test_a_bias_shift_on_a_regression_fails_its_golden_check_although_argmax_agreement_says_1() -> None:
    golden, _ = _regression_golden()
    tolerance = 1e-3 * max(1.0, float(np.abs(golden.expected["y"]).max()))
    spec = GoldenSpec(
        count=64,
        max_abs_error=tolerance,
        min_agreement=1.0,
        outputs=derive_checks(golden.reference, golden.expected, tolerance),
    )
    bias = 0.5 * tolerance  # inside the bundle-wide max-abs tolerance: only the per-kind check can see it
    shifted = {"y": golden.expected["y"] + np.float32(bias)}
    assert argmax_agreement(shifted["y"], golden.reference["y"]) == 1.0  # what the device judged before: blind

    good = compare({"y": golden.expected["y"]}, golden, spec)
    bad = compare(shifted, golden, spec)
    assert good.passed and good.scores[0].rule == "continuous" and good.agreement == 1.0
    assert not bad.passed and "SQNR" in bad.reason
    (scored,) = bad.scores
    assert scored.detail["sqnr_db"] < spec.outputs[0].min_sqnr_db  # type: ignore[operator]
    assert scored.detail["max_abs"] < tolerance


def test_a_bundle_without_recorded_checks_gets_them_derived_from_its_own_golden_data() -> None:
    golden, shifted = _regression_golden(bias=0.05)
    legacy = GoldenSpec(count=64, max_abs_error=1.0, min_agreement=1.0)  # an older manifest: no per-output checks
    assert "outputs" not in legacy.model_dump()  # still serializes as before, so older agents parse it
    result = compare({"y": shifted}, golden, legacy)
    assert not result.passed and result.scores[0].rule == "continuous"


def test_class_scores_report_agreement_and_top_k_and_fail_below_the_measured_floor() -> None:
    reference = _logits()
    check = derive_check("logits", reference, reference, 1e-3)
    assert check.rule == "class-agreement" and check.top_k == 5 and check.min_agreement == pytest.approx(1 - 1 / 64)
    rolled = np.roll(reference, 1, axis=-1)  # every sample's top class moves
    result = score(check, rolled, reference)
    assert not result.passed and result.score < 0.2 and 0 <= result.detail["top_k"] <= 1
    assert score(check, reference.copy(), reference).passed


def test_tolerances_follow_the_artifacts_spread() -> None:
    reference = RNG.random((64, 1, 1)).astype(np.float32)
    exact = derive_check("p", reference, reference, 1e-3)
    noisy = derive_check(
        "p", reference, reference + RNG.normal(scale=1e-2, size=reference.shape).astype(np.float32), 1e-3
    )
    assert exact.min_sqnr_db is not None and noisy.min_sqnr_db is not None
    assert exact.min_sqnr_db == pytest.approx(80.0)  # bit-exact build: 120 dB capped, minus the 40 dB margin
    assert noisy.min_sqnr_db < exact.min_sqnr_db and noisy.min_sqnr_db == pytest.approx(
        noisy.measured["sqnr_db"] - 10, abs=1e-3
    )
    assert noisy.max_abs_error is not None and noisy.max_abs_error >= 2 * noisy.measured["max_abs"]


def test_a_missing_or_misshapen_output_scores_zero() -> None:
    reference = _logits()
    check = derive_check("logits", reference, reference, 1e-3)
    assert not score(check, None, reference).passed
    assert score(check, reference[:, :, :5], reference).score == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_output_that_is_not_finite_fails_with_a_score_of_zero_and_says_so(bad: float) -> None:
    """A perturbed ppocr-det build gave NaN maps on a device: its golden check raised a validation error instead of
    failing (bench/rollout_corpus.py), and a NaN compares below no floor, so it must never reach the comparisons."""
    reference = RNG.random((16, 1, 8, 8)).astype(np.float32)
    check = derive_check("map", reference, reference, 1e-3)
    got = reference.copy()
    got[3, 0, 2, 2] = bad
    result = score(check, got, reference)
    assert not result.passed and result.score == 0.0
    assert result.detail["non_finite"] == 1.0
    assert explain(result, check) == "output 'map' holds 1 NaN or infinite value(s)"
