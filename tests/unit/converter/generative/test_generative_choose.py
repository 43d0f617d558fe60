"""The choice among judged generative candidates: the fastest TPOT inside the bars, noise-sized ties broken by the
profile's order; the profile's order alone when nothing passing was timed; a reason for every other."""

from __future__ import annotations

from edgefleet.converter.generative.choose import Judged, choose, over_every_limit


def test_the_fastest_inside_the_bars_wins() -> None:
    decision = choose([
        Judged("int4", 0, "perplexity 1.2x FP32's is over the bar 1.05x", 0.05, 10),
        Judged("int8", 1, None, 0.10, 20),
        Judged("fp32", 2, None, 0.30, 40),
    ])  # fmt: skip
    assert decision.chosen == "int8"
    assert decision.reasons["int4"].startswith("perplexity")
    assert decision.reasons["fp32"].startswith("slower: TPOT 0.3000 ms vs 0.1000 ms for int8 (3.00x)")


def test_a_tie_within_noise_goes_to_the_profiles_order() -> None:
    decision = choose([Judged("int4", 0, None, 0.105, 10), Judged("fp32", 2, None, 0.100, 40)])
    assert decision.chosen == "int4" and "within 10%" in decision.reasons["fp32"]
    assert "first in the profile's order" in decision.how


def test_untimed_candidates_follow_the_profiles_order() -> None:
    decision = choose([Judged("fp16", 1, None, None, 20), Judged("int4", 0, None, None, 10)])
    assert decision.chosen == "int4" and "precision order" in decision.reasons["fp16"]
    assert "not timed" in decision.how


def test_a_timed_candidate_beats_an_untimed_one() -> None:
    decision = choose([Judged("gpu", 0, None, None, 10), Judged("cpu", 1, None, 0.2, 20)])
    assert decision.chosen == "cpu" and decision.reasons["gpu"].startswith("not timed on this host")


def test_nothing_passes() -> None:
    decision = choose([Judged("int4", 0, "agreement", 0.1, 1)])
    assert decision.chosen is None and decision.reasons == {"int4": "agreement"}


def test_a_build_over_the_limit_of_every_profile_that_plans_it_is_refused_before_it_is_judged() -> None:
    refused = over_every_limit(
        {"fp32": 546_000_000, "bf16": 546_000_000, "int8": 170_000_000, "int4": 110_000_000},
        {"fp32": [500.0], "bf16": [500.0, 1000.0], "int8": [500.0], "int4": [100.0, 500.0]},
    )
    assert refused == {"fp32": "546.0 MB is over the profile's 500 MB: not judged or timed"}  # bf16 fits one
