"""The rollout's default golden guardrail passes exactly the bundles the converter's golden gate ships
(edgefleet.core.quality.golden_hold): one definition of "good enough" from converter to device."""

from __future__ import annotations

import pytest

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.evidence import Metrics, Thresholds
from edgefleet.control.rollout.judge.quality import golden as judge_golden
from edgefleet.core.quality.golden_hold import hold

from support.golden_sets import SAMPLES, classifier_golden


@pytest.mark.parametrize("flips", [0, 1, 2, 3])
def test_the_rollout_judge_agrees_with_the_converters_verdict(flips: int) -> None:
    """The judge (edgefleet/control/rollout/judge/quality.py), with the drop engine.py plans for a bundle replacing
    its FP32 build on a device that reproduces the build's figures, passes exactly the bundles the converter ships."""
    data, spec = classifier_golden(flips)
    drop = 0.01
    figures, _ = hold(data.expected, data, spec, None, drop, runtime="onnxruntime")
    facts = BundleFacts(bundle_id="b", profile="p", size=1, wire_bytes=1, golden_count=SAMPLES,
                        golden_min_agreement=spec.min_agreement)  # fmt: skip
    planned = max(0.0, 1.0 - (facts.build_agreement() or 1.0))
    t = Thresholds(max_golden_drop=drop + min(planned, drop))
    fp32 = _metrics(1.0, {"logits": 1.0})
    finding = judge_golden(fp32, _metrics(figures.agreement, figures.scores), t)
    assert finding is not None and finding.ok is figures.passed


def _metrics(agreement: float, scores: dict[str, float]) -> Metrics:
    return Metrics(bundle_id="b", reports=3, requests=0, errors=0, p95_ms=None, fresh_reports=3,
                   golden_agreement=agreement, golden_scores=scores)  # fmt: skip
