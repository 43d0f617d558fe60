"""Judging against FP32 (perplexity ratio, next-token agreement), the bars and their refusals, and the device floors
the golden prompts carry."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from edgefleet.converter.generative.bars import QualityBars
from edgefleet.converter.generative.golden import OwnFigures, floors
from edgefleet.converter.generative.judge import Reference, score_logits


def _reference(windows: list[np.ndarray], logits: list[np.ndarray]) -> Reference:
    from edgefleet.core.quality.generation import negative_log_likelihood, next_tokens, perplexity

    nll = [negative_log_likelihood(lg, w) for lg, w in zip(logits, windows, strict=True)]
    return Reference(
        windows=windows, next_tokens=[next_tokens(lg)[: len(w) - 1] for lg, w in zip(logits, windows, strict=True)],
        perplexity=perplexity(sum(n for n, _ in nll), sum(c for _, c in nll)), tokens=sum(c for _, c in nll),
    )  # fmt: skip


def test_the_reference_scores_one_and_noise_scores_less() -> None:
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, 50, 40), rng.integers(0, 50, 17)]
    logits = [rng.normal(size=(len(w), 50)).astype(np.float32) for w in windows]
    reference = _reference(windows, logits)
    same = score_logits(logits, reference)
    assert same.perplexity_ratio == pytest.approx(1.0) and same.agreement == 1.0 and same.tokens == 39 + 16
    noisy = score_logits([lg + rng.normal(scale=2.0, size=lg.shape) for lg in logits], reference)
    assert noisy.agreement < 0.8 and noisy.perplexity_ratio != pytest.approx(1.0)


def test_bars_name_what_failed() -> None:
    bars = QualityBars()
    assert (bars.max_perplexity_ratio, bars.min_next_token_agreement) == (1.05, 0.80)
    assert bars.refusal(1.049, 0.81) is None
    assert bars.refusal(1.06, 0.9) == "perplexity 1.0600x FP32's is over the bar 1.05x"
    both = QualityBars(max_perplexity_ratio=1.001, min_next_token_agreement=0.95).refusal(1.01, 0.9)
    assert both is not None and "perplexity 1.0100x" in both and "next-token agreement 0.9000 is under" in both
    with pytest.raises(ValidationError):
        QualityBars(max_perplexity_ratio=0.99)


def test_device_floors_are_the_artifacts_own_figures_less_a_margin() -> None:
    exact = floors(OwnFigures(next_token_agreement=1.0, continuation_agreement=1.0, perplexity_ratio=1.0))
    assert (exact.min_next_token_agreement, exact.min_continuation_agreement, exact.max_perplexity_ratio) == (
        0.9, 0.75, 1.05
    )  # fmt: skip
    int4 = floors(OwnFigures(next_token_agreement=0.88, continuation_agreement=0.2, perplexity_ratio=0.98))
    assert (int4.min_next_token_agreement, int4.min_continuation_agreement, int4.max_perplexity_ratio) == (
        0.78, 0.0, 1.029
    )  # fmt: skip
