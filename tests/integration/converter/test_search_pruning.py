"""Early pruning in the recipe search: a candidate is dropped only when one already inside the budget is faster
than its fastest run, so the fastest candidate inside the budget is never dropped, and a dropped candidate
has no accuracy score, so it can never ship."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import numpy as np

from edgefleet.converter import ConvertRequest, convert, phases
from edgefleet.converter.runners import ort_runner
from edgefleet.converter.search.choose import Candidate, choose
from edgefleet.converter.timing.latency import interleaved_latency
from edgefleet.converter.timing.pruning import MIN_EVIDENCE, Pruner, retries_cannot_win, retries_verdict, timing_losers
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.tensors import Dataset
from edgefleet.core.trust.signing import SigningKey

from support.host_cpu import as_this_host
from support.models.timing import matmul_chain
from support.paths import DIGITS

BAR = 0.9


def _runs(rng: random.Random, median: float, count: int) -> list[float]:
    """Run times around `median` with the long right tail of a loaded machine."""
    return [median * (1 + abs(rng.gauss(0, 0.08))) * (3 if rng.random() < 0.05 else 1) for _ in range(count)]


def _search(order: list[tuple[str, list[float], float]]) -> list[Candidate]:
    """What the search does with each candidate in build order: evaluate sample by sample while the pruner lets
    it, then gate it; a candidate inside the budget becomes a bound for the rest."""
    pruner, out = Pruner(), []
    for name, runs, score in order:
        seen: list[float] = []
        why = None
        for value in runs:
            seen.append(value)
            why = pruner.beaten(seen)
            if why:
                break
        if why:
            out.append(Candidate(name, "int8-static", "openvino", 1, error=why))
            continue
        gate = None if score >= BAR else f"score {score} below {BAR}"
        if gate is None:
            pruner.accept(name, runs)
        out.append(
            Candidate(name, "int8", "openvino", 1, accuracy=score, latency_ms=statistics.median(runs), gate=gate)
        )
    return out


def test_pruning_never_drops_the_fastest_candidate_inside_the_budget() -> None:
    rng = random.Random(12)
    for _trial in range(400):
        specs = [(f"c{i}", _runs(rng, rng.uniform(1, 50), 24), rng.choice([0.5, 0.95, 0.99])) for i in range(6)]
        everything = [
            Candidate(
                n, "int8", "openvino", 1, accuracy=s, latency_ms=statistics.median(r), gate=None if s >= BAR else "x"
            )
            for n, r, s in specs
        ]
        unpruned = choose(everything, reference=1.0, max_drop=1.0, size_limit_bytes=10)
        rng.shuffle(specs)
        pruned = choose(_search(specs), reference=1.0, max_drop=1.0, size_limit_bytes=10)
        assert (pruned.chosen and pruned.chosen.name) == (unpruned.chosen and unpruned.chosen.name)


def test_a_pruned_candidate_is_never_chosen_and_says_why() -> None:
    pruner = Pruner()
    pruner.accept("ov-bf16", [10.0] * 5)
    why = pruner.beaten([30.0, 31.0, 29.0])
    assert why and why.startswith("pruned:") and "ov-bf16" in why
    assert pruner.beaten([30.0] * (MIN_EVIDENCE - 1)) is None, "too little evidence"
    assert pruner.beaten([30.0, 30.0, 10.5]) is None, "one run within the margin keeps it"
    candidates = [
        Candidate("ov-bf16", "bf16", "openvino", 1, accuracy=0.99, latency_ms=10.0),
        Candidate("ov-int8-nncf", "int8-static", "openvino", 1, error=why),
    ]
    choice = choose(candidates, reference=1.0, max_drop=0.05, size_limit_bytes=10)
    assert choice.chosen is not None and choice.chosen.name == "ov-bf16"
    assert choice.rejected[0].rejected == why


def test_timing_never_stops_the_runner_with_the_best_median() -> None:
    rng = random.Random(7)
    for _trial in range(400):
        times = {f"r{i}": _runs(rng, rng.uniform(1, 20), rng.randint(3, 40)) for i in range(5)}
        best = min(times, key=lambda n: statistics.median(times[n]))
        losers = timing_losers(times)
        assert best not in losers
        for name in losers:
            assert min(times[name]) > statistics.median(times[best])


def test_interleaved_timing_stops_a_runner_that_cannot_win() -> None:
    """A 1-layer and a 200-layer chain: the slow one is dropped after the first rounds, the fast one runs them all."""
    small = {"x": np.ones((4, 1, 256), np.float32)}
    runners = {"fast": ort_runner(matmul_chain(256, 1)), "slow": ort_runner(matmul_chain(256, 200))}
    stats = interleaved_latency(runners, Dataset(small, None), rounds=5, runs_per_round=10, warmup=2,
                                prune=timing_losers)  # fmt: skip
    assert stats["fast"].runs == 50 and stats["slow"].runs < 50
    assert stats["slow"].median_ms > stats["fast"].median_ms


def test_a_verdict_from_evaluation_times_is_confirmed_head_to_head_before_pruning() -> None:
    """Evaluation times come from different moments; the search prunes only what loses side by side."""
    feeds = {"x": np.ones((1, 256), np.float32)}
    fast, slow = ort_runner(matmul_chain(256, 1)), ort_runner(matmul_chain(256, 200))
    pruner = Pruner()
    pruner.accept("fast", [0.01] * 5, lambda: fast)
    assert pruner.confirm(slow, feeds) is not None, "200 layers never beat 1"
    twin = ort_runner(matmul_chain(256, 1))
    assert pruner.beaten([5.0] * 5) is not None, "a burst of load makes the twin look slow"
    assert pruner.confirm(twin, feeds) is None, "head to head, the same model is not slower"
    assert Pruner().confirm(slow, feeds) is None, "nothing inside the budget yet: nothing to lose against"


def test_a_shipped_bundle_always_passed_its_accuracy_gate(tmp_path: Path, signing_key: SigningKey) -> None:
    """The real search on the digits CNN, phases clocked: whatever was pruned, the shipped recipe has a score
    that meets the bar, and every candidate without a score was refused with its reason."""
    with phases.recording() as clock:
        (result,) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[as_this_host(get_profile("intel-x86-vnni"))],
                calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=tmp_path, key=signing_key, name="digits",
                version="1", report=False,
            )
        )  # fmt: skip
    assert result.bundle is not None and result.recipe is not None
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.search is not None and manifest.accuracy.passed
    assert manifest.search.scores[result.recipe] >= manifest.search.bar
    for candidate in result.candidates:
        if candidate["name"] == result.recipe:
            assert candidate["accuracy"] is not None and candidate["gate"] is None and not candidate["rejected"]
        elif candidate["accuracy"] is None:
            assert candidate["rejected"], candidate
    assert clock.seconds["accuracy"] > 0 and clock.seconds["prepare"] > 0 and clock.counts["timing"] >= 1


def test_a_pruned_build_is_cached_unevaluated_and_gets_its_outputs_later(tmp_path: Path) -> None:
    from edgefleet.converter.search.cache import BuildCache

    cache, artifact = BuildCache(tmp_path / "cache"), tmp_path / "model.onnx"
    artifact.write_bytes(b"artifact")
    cache.put("ab" * 32, {"model/model.onnx": artifact}, {"files": ["model/model.onnx"], "evaluated": False}, {})
    first = cache.get("ab" * 32)
    assert first is not None and first.meta["evaluated"] is False and first.outputs == {}
    outputs = {"y": np.arange(3, dtype=np.float32)}
    stored = {"model/model.onnx": first.file("model/model.onnx")}  # the entry's own file, as build() passes it
    cache.put("ab" * 32, stored, {"files": ["model/model.onnx"], "evaluated": True}, outputs, replace=True)
    second = cache.get("ab" * 32)
    assert second is not None and second.meta["evaluated"] is True
    assert second.file("model/model.onnx").read_bytes() == b"artifact"
    np.testing.assert_array_equal(second.outputs["y"], outputs["y"])


def test_retries_of_plain_int8_that_is_not_faster_than_a_candidate_inside_the_budget_are_not_built() -> None:
    """A retry (other calibration, float layers, NNCF accuracy control) keeps as much or more in float than the
    plain INT8 model, so it runs no faster: when plain INT8 does not beat the best candidate inside the budget
    head to head, none of its retries can ship."""
    precisions = {"ov-bf16": "bf16", "ort-int8-static-u8s8": "int8-static", "ort-fp32": "fp32"}
    assert retries_verdict(None, "int8-static", precisions) is None, "nothing inside the budget yet"
    assert retries_verdict(("ov-bf16", 0.86), "int8-static", precisions) is None, "INT8 well ahead: AC may win"
    why = retries_verdict(("ov-bf16", 1.02), "int8-static", precisions, " (bf16 hint)")
    assert why and "1.02x the time of ov-bf16" in why and "(bf16 hint)" in why
    # Within the head to head's noise the tie-break prefers the higher precision: 0.97x cannot win either.
    assert retries_verdict(("ov-bf16", 0.97), "int8-static", precisions) is not None
    # Against a candidate of the same precision there is no tie-break to rely on: only slower-or-equal prunes.
    assert retries_verdict(("ort-int8-static-u8s8", 0.97), "int8-static", precisions) is None
    assert retries_verdict(("ort-int8-static-u8s8", 1.0), "int8-static", precisions) is not None


def test_the_retry_rule_times_the_plain_model_head_to_head() -> None:
    feeds = {"x": np.ones((1, 256), np.float32)}
    fast, slow = ort_runner(matmul_chain(256, 1)), ort_runner(matmul_chain(256, 200))
    pruner = Pruner()
    pruner.accept("ort-fp32", [0.01] * 5, lambda: fast)
    precisions = {"ort-fp32": "fp32"}
    assert retries_cannot_win(Pruner(), slow, feeds, "int8-static", precisions) is None, "no bound yet"
    why = retries_cannot_win(pruner, slow, feeds, "int8-static", precisions)
    assert why is not None and "ort-fp32" in why, "200 layers never beat 1"
    duel = pruner.ratio(slow, feeds)
    assert duel is not None and duel[0] == "ort-fp32" and duel[1] > 1.0
