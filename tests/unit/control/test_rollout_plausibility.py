"""Evidence before a device passes (judge/plausibility.py), as tables: fetched bytes, install time, plausible
latency and golden scores inside their bands; an implausible report is a named failure, missing data waits."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.evidence import Metrics, Thresholds
from edgefleet.control.rollout.judge.golden_bands import Band, OutputBands
from edgefleet.control.rollout.judge.plausibility import GoldenReport, InstallEvidence, LinkSample, judge_evidence
from edgefleet.core.messages import OutputScore

A, B, C = "a" * 64, "b" * 64, "c" * 64
FACTS = BundleFacts(
    bundle_id="m-2-generic-x86-64", profile="generic-x86-64", size=300_000, wire_bytes=250_000,
    chunks={A: 100_000, B: 100_000, C: 50_000}, golden_count=8,
    golden={"logits": OutputBands(rule="class-agreement", score=Band(lo=0.875, hi=0.9375),
                                  agreement=Band(lo=0.875, hi=0.9375))},
    build_latency_ms=0.83, build_machine="build host", farm_latency_ms={"rpi5-arm64": 6.0},
)  # fmt: skip
PREVIOUS = BundleFacts(bundle_id="m-1-generic-x86-64", profile="generic-x86-64", size=1, wire_bytes=150_000,
                       chunks={A: 100_000, "d" * 64: 50_000})  # fmt: skip
T = Thresholds()


def install(**changes: Any) -> InstallEvidence:
    fields: dict[str, Any] = {
        "deployed_at": 100.0, "committed_at": 101.5, "link_before": LinkSample(1_000, 50.0),
        "link_after": LinkSample(1_000 + 150_000, 52.0), "needed_bytes": FACTS.needed_bytes([PREVIOUS]),
    }  # fmt: skip
    fields.update(changes)
    return InstallEvidence(**fields)


def observed(p50: float | None = 0.8, p95: float | None = 1.0) -> Metrics:
    return Metrics(bundle_id=FACTS.bundle_id, reports=4, requests=400, errors=0, p95_ms=p95, p50_ms=p50,
                   fresh_reports=4, golden_agreement=1.0)  # fmt: skip


def scores(score: float = 0.9375, output: str = "logits", passed: bool = True) -> GoldenReport:
    return GoldenReport((OutputScore(output=output, rule="class-agreement", score=score, passed=passed),), score)


def test_the_chunks_a_device_already_held_are_not_needed_again() -> None:
    assert FACTS.needed_bytes([]) == 250_000
    assert FACTS.needed_bytes([PREVIOUS]) == 150_000, "chunk A came with the bundle it committed before"
    blocks = FACTS.model_copy(update={"chunks": {}})
    assert blocks.needed_bytes([PREVIOUS]) == 250_000, "a block layout is fetched whole"


@pytest.mark.parametrize(
    ("evidence", "metrics", "golden", "verdict", "detail"),
    [
        (install(), observed(), [scores()], True, "evidence holds: fetched 150000 bytes"),
        (install(already_ran=True, committed_at=None, link_before=None, link_after=None), observed(), [scores()],
         True, "ran the bundle before the wave"),
        # the attack of issue 20: "committed" with nothing fetched, p95 0.02 ms for a 0.83 ms model, golden 1.0
        (install(link_after=LinkSample(1_000, 51.0), committed_at=100.0), observed(0.01, 0.02), [scores()], False,
         "implausible report: committed having fetched 0 bytes by its link counters; the bundle needs 150000"),
        (install(), observed(0.01, 0.02), [scores()], False,
         "p50 0.010 ms is more than 20× faster than the bundle's 0.830 ms measured by the build (build host)"),
        (install(), observed(1.2, 1.0), [scores()], False, "p50 1.200 ms above its p95 1.000 ms"),
        (install(committed_at=99.0), observed(), [scores()], False, "arrived 1.000 s before the host deployed"),
        (install(committed_at=100.0001), observed(), [scores()], False, "fetching and checking it takes at least"),
        (install(), observed(), [scores(0.5)], False, "logits class-agreement score 0.5000 is outside 0.875–0.9375"),
        (install(), observed(), [scores(1.0)], False, "score 1.0000 is outside 0.875–0.9375, what its golden outputs"),
        (install(), observed(), [scores(output="other")], False, "golden scores name outputs other"),
        (install(), observed(), [GoldenReport((), 1.0)], False, "golden agreement 1.0000 is above 0.9375, the most"),
        (install(), observed(), [GoldenReport((), 0.5)], True, "evidence holds"),  # low: the golden criterion's
        (install(), observed(), [scores(0.5, passed=False)], True, "evidence holds"),  # the golden criterion fails it
        (install(link_after=None), observed(), [scores()], None, "no link counters reported since the commit"),
        (install(committed_at=None), observed(), [scores()], None, 'no "committed" event received'),
        (install(link_after=LinkSample(10, 60.0)), observed(), [scores()], None, "its link counters restarted"),
        (install(), observed(p95=None, p50=None), [scores()], None, "no latency reported on the new bundle yet"),
        (install(), observed(), [], None, "no golden result reported on the new bundle yet"),
    ],
    ids=["honest", "already-ran", "issue-20-fake-commit", "20x-faster", "p50-above-p95", "commit-before-deploy",
         "instant-commit", "golden-below-band", "golden-too-good", "golden-wrong-outputs", "legacy-too-good",
         "legacy-low",
         "failed-golden-left-to-golden", "no-link", "no-commit", "agent-restarted", "no-latency", "no-golden"],
)  # fmt: skip
def test_evidence(evidence: InstallEvidence, metrics: Metrics, golden: list[GoldenReport], verdict: bool | None,
                  detail: str) -> None:  # fmt: skip
    finding = judge_evidence(FACTS, evidence, metrics, golden, "generic-x86-64", T)
    assert finding.criterion == "evidence"
    assert finding.ok is verdict, finding.detail
    assert finding.pending is (verdict is None)
    assert detail in finding.detail, finding.detail
    if verdict is False:
        assert finding.detail.startswith("implausible report: ")


def test_the_farm_measurement_for_the_devices_profile_comes_before_the_build() -> None:
    slow_device = observed(p50=1.0, p95=1.2)  # plausible against the 0.83 ms build, 6x faster than the farm's rpi5s
    assert judge_evidence(FACTS, install(), slow_device, [scores()], "generic-x86-64", T).ok is True
    finding = judge_evidence(FACTS, install(), observed(0.2, 0.25), [scores()], "rpi5-arm64", T)
    assert finding.ok is False and "measured by the farm's rpi5-arm64 devices" in finding.detail
    relaxed = T.model_copy(update={"max_speedup": None})
    assert judge_evidence(FACTS, install(), observed(0.01, 0.02), [scores()], "generic-x86-64", relaxed).ok is True


def test_a_bundle_without_facts_is_never_passed() -> None:
    finding = judge_evidence(None, install(), observed(), [scores()], "generic-x86-64", T)
    assert finding.ok is None and finding.pending and "no facts of bundle" in finding.detail
