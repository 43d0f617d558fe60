"""Mixed precision is not judged on the data it tuned on: its float layers are chosen on a seeded selection split of
the evaluation set and the variant chosen is judged once on the held-out split; plain recipes are judged on the
whole evaluation set as before; an evaluation set too small to split gets no mixed precision, and says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from edgefleet.converter import ConvertRequest, ProfileResult, convert
from edgefleet.converter.search.choose import Candidate, choose
from edgefleet.converter.search.holdout import MIN_PART, split_indices
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.models.mixed import outlier_model


@pytest.mark.parametrize("count", [2 * MIN_PART, 32, 33, 101])
def test_the_split_is_deterministic_disjoint_and_covers_the_evaluation_set(count: int) -> None:
    split = split_indices(count)
    assert split == split_indices(count)  # the same data always splits the same way
    assert not split.refused and not set(split.selection) & set(split.held_out)
    assert sorted(split.selection + split.held_out) == list(range(count))
    assert len(split.selection) == count // 2 and len(split.held_out) == count - count // 2
    assert split.selection != tuple(range(count // 2))  # shuffled, not the file's first half


@pytest.mark.parametrize("count", [1, 5, 2 * MIN_PART - 1])
def test_an_evaluation_set_too_small_to_split_is_refused_with_the_reason(count: int) -> None:
    split = split_indices(count)
    assert split.selection == split.held_out == ()
    assert f"the evaluation set has {count} samples" in split.refused
    assert f"needs at least {2 * MIN_PART}" in split.refused and "mixed precision not tried" in split.refused


STRICT_METRIC = '''
import numpy as np


def strict_on_flagged(reference, candidate, labels):
    """Per sample: label 0 scores its per-position argmax agreement, label 1 demands the FP32 logits (1e-3)."""
    want, got = reference["logits"], candidate["logits"]
    scores = []
    for i in range(len(want)):
        if labels[i] == 1:
            scores.append(float(np.max(np.abs(want[i] - got[i])) <= 1e-3))
        else:
            scores.append(float(np.mean(want[i].argmax(-1) == got[i].argmax(-1))))
    return float(np.mean(scores))
'''


def _convert(tmp_path: Path, key: SigningKey, **request: object) -> tuple[ProfileResult, Manifest]:
    labels = request.pop("labels", None)
    count = int(request.pop("eval_count", 32))  # type: ignore[call-overload]
    model, calib, evaluation = outlier_model(tmp_path / "model", count, labels)  # type: ignore[arg-type]
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("generic-x86-64")], calib=calib, eval=evaluation,
            out=tmp_path / "out", key=key, name="outlier", version="1", report=False, runtimes=("onnxruntime",),
            prune=False, **request,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    assert result.bundle, result.error
    return result, parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)


def test_a_float_set_tuned_on_the_selection_split_is_judged_on_the_held_out_split_and_refused_when_it_overfits(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    """The held-out samples (label 1) demand the FP32 logits, which no INT8 variant gives, while the selection
    samples (label 0) only ask for argmax agreement, which keeping the outlier's layers in float restores. The
    exclusion search, confirming on the selection split, settles on a float set that clears the bar 0.4 there;
    judged on the whole set as before, it would score half its selection score (the flagged half scores 0) and
    clear the bar too; held out it scores 0 and is refused."""
    split = split_indices(32)
    labels = np.zeros(32, np.int64)
    labels[list(split.held_out)] = 1
    (tmp_path / "metric.py").write_text(STRICT_METRIC)
    result, manifest = _convert(
        tmp_path, signing_key, labels=labels, metric=f"{tmp_path / 'metric.py'}:strict_on_flagged", min_score=0.4
    )
    assert manifest.search is not None
    mixed = [c for c in result.candidates if "-float" in str(c["name"])]
    assert mixed, result.notes  # plain INT8 missed the bar (0.13), so the exclusion search ran
    (chosen,) = [c for c in mixed if "held-out split" in str(c["rejected"])]  # the one the search settled on
    name = str(chosen["name"])
    judged = manifest.search.judged_on[name]
    assert judged.startswith("held-out split (16 samples)")
    selection_score = float(judged.rsplit("score ", 1)[1].rstrip(")"))
    assert (selection_score + 0.0) / 2 >= 0.4  # the whole set, half of it flagged, would have passed it
    assert chosen["accuracy"] == manifest.search.scores[name] == 0.0  # its held-out score is the one reported
    assert "it met the bar on the 16 selection samples" in str(chosen["rejected"])
    for other in mixed:  # every other float set missed the bar on the selection split and went no further
        if other is not chosen:
            assert str(other["rejected"]).startswith("selection split (16 samples)")
    # the plain recipe that ships is judged on the whole evaluation set, as before
    assert "-float" not in manifest.recipe.name and manifest.accuracy.judged_on == "evaluation set"
    assert manifest.accuracy.samples == 32 and manifest.accuracy.selection_samples == 0
    assert manifest.accuracy.value >= 0.4 and manifest.recipe.name not in manifest.search.judged_on


def test_the_float_set_a_search_settles_on_carries_its_held_out_score_and_the_split_that_judged_it(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    result, manifest = _convert(tmp_path, signing_key, metric="per-position-agreement", min_score=0.95)
    assert manifest.search is not None
    assert any("16 selection / 16 held-out samples of 32 (seeded split, seed 12)" in n for n in result.notes)
    held_out = {n: j for n, j in manifest.search.judged_on.items() if j.startswith("held-out split (16 samples)")}
    (name,) = held_out  # one variant is judged held out: the smallest float set that met the bar on the selection
    (candidate,) = [c for c in result.candidates if c["name"] == name]
    (verdict,) = [n for n in result.notes if n.startswith(f"{name}: per-position-agreement ")]
    assert f"{manifest.search.scores[name]:.4f} on the held-out split (16 samples)" in verdict
    if manifest.search.scores[name] >= 0.95:  # met it held out too: it competes on speed with the plain recipes
        assert verdict.endswith("meets the bar") and not str(candidate["rejected"] or "").startswith("held-out")
    else:  # refused on the held-out split, however it scored on the selection split
        assert verdict.endswith("refused") and str(candidate["rejected"]).startswith("held-out split (16 samples)")
    if manifest.recipe.name == name:  # it ships unless a plain recipe ran faster here
        assert manifest.accuracy.judged_on == held_out[name] and manifest.accuracy.samples == 16
        assert manifest.accuracy.selection_samples == 16 and manifest.accuracy.value >= 0.95
    else:
        assert manifest.accuracy.judged_on == "evaluation set" and manifest.accuracy.samples == 32


def test_an_evaluation_set_too_small_to_split_gets_no_mixed_precision_and_the_report_says_why(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    count = 2 * MIN_PART - 2
    result, manifest = _convert(
        tmp_path, signing_key, eval_count=count, metric="per-position-agreement", min_score=0.95
    )
    assert manifest.search is not None and not manifest.search.judged_on
    names = [str(c["name"]) for c in result.candidates]
    assert any(n.startswith("ort-int8-static") for n in names)  # plain INT8 was built and missed the bar
    assert not any("-float" in n for n in names)  # no float set chosen and judged on the same samples
    (refusal,) = [n for n in result.notes if "mixed precision not tried" in n]
    assert f"the evaluation set has {count} samples" in refusal and f"at least {2 * MIN_PART}" in refusal
    assert manifest.accuracy.judged_on == "evaluation set" and manifest.accuracy.samples == count


def test_the_choice_holds_a_held_out_candidate_to_the_bar_on_its_split_and_the_others_to_the_evaluation_sets() -> None:
    """top1 with labels and a 0.05 drop budget: FP32 scores 0.90 on the evaluation set and 0.80 on the held-out
    split, so the held-out bar is 0.75; a mixed candidate scoring 0.78 there meets it, a plain one scoring 0.78
    on the whole set does not (its bar is 0.85)."""
    mixed = Candidate("ort-int8-static-float2", "int8-static", "onnxruntime", 1000, 0.78, 1.0, bar=0.75)
    plain = Candidate("ort-int8-static", "int8-static", "onnxruntime", 1000, 0.78, 0.9)
    choice = choose([mixed, plain], reference=0.9, max_drop=0.05, size_limit_bytes=10**6)
    assert choice.chosen is not None and choice.chosen.name == mixed.name
    (rejected,) = choice.rejected
    assert rejected.name == plain.name and "below the budget floor 0.8500" in str(rejected.rejected)
    too_low = choose([dataclasses.replace(mixed, accuracy=0.74)], reference=0.9, max_drop=0.05, size_limit_bytes=10**6)
    assert too_low.chosen is None and "below the budget floor 0.7500" in str(too_low.rejected[0].rejected)
