"""Accuracy-aware mixed precision: the float set is found with few builds, NNCF's accuracy control is driven by
the task metric, and on a real model whose plain INT8 misses the task bar the conversion ships a bundle that
meets it, having tried the mixed-precision recipes and recorded the layers they kept in float."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.search.mixed.float_set import growth_counts, search_float_set
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.models import corpus
from support.models.mixed import outlier_model


def _threshold(needed: int | None):  # type: ignore[no-untyped-def]
    """A build that meets the bar once at least `needed` layers are in float (None: never)."""
    built: list[int] = []

    def try_count(count: int) -> tuple[int, bool]:
        built.append(count)
        return count, needed is not None and count >= needed

    return try_count, built


@pytest.mark.parametrize("total, needed", [(40, 13), (40, 1), (40, 40), (64, 33), (7, 4), (1, 1), (100, 2)])
def test_the_exclusion_search_finds_the_smallest_float_set_in_few_builds(total: int, needed: int) -> None:
    try_count, built = _threshold(needed)
    found = search_float_set(total, try_count)
    assert found.best is not None and found.best.count == needed
    assert len(built) == len(set(built))  # no count is built twice
    assert len(built) <= 2 * math.ceil(math.log2(total)) + 1  # about 2·log2(n) builds, never one per layer
    assert [t.count for t in found.failed if t.passed] == [c for c in built if c >= needed and c != needed]


def test_the_exclusion_search_gives_up_after_every_layer_is_in_float() -> None:
    try_count, built = _threshold(None)
    found = search_float_set(40, try_count)
    assert found.best is None and built == growth_counts(40) == [1, 2, 4, 8, 16, 32, 40]


def test_the_exclusion_search_stops_when_the_time_budget_is_spent() -> None:
    try_count, built = _threshold(30)
    found = search_float_set(64, try_count, out_of_time=lambda: len(built) >= 3)
    assert built == [1, 2, 4] and found.best is None and "time budget" in found.stopped


def _convert_outlier(tmp_path: Path, key: SigningKey, profile: str, runtime: str):  # type: ignore[no-untyped-def]
    model, calib, evaluation = outlier_model(tmp_path / "model")
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile(profile)], calib=calib, eval=evaluation, out=tmp_path / "out",
            key=key, name="outlier", version="1", report=False, metric="per-position-agreement", min_score=0.95,
            runtimes=(runtime,), prune=False,  # every plain INT8 build is scored, even one slower than FP32 here
        )
    )  # fmt: skip
    assert result.bundle, result.error
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.search is not None and manifest.accuracy.value >= 0.95
    scores = {n: s for n, s in manifest.search.scores.items() if s is not None}
    return result, manifest, scores


def test_ort_int8_that_misses_its_bar_ships_with_the_fewest_worst_layers_in_float_found_in_few_builds(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    result, manifest, scores = _convert_outlier(tmp_path, signing_key, "generic-x86-64", "onnxruntime")
    plain = [n for n in scores if n.startswith("ort-int8-static") and "float" not in n]
    assert plain and max(scores[n] for n in plain) < 0.95  # every plain INT8 calibration misses the bar
    (summary,) = [n for n in result.notes if n.startswith("ORT exclusion search over")]
    ranked, builds = int(summary.split(" over ")[1].split()[0]), int(summary.split(", ")[1].split()[0])
    assert builds <= 2 * math.ceil(math.log2(ranked)) + 1  # few builds, never one per layer
    mixed = {n: s for n, s in scores.items() if "-float" in n}  # each scored on the split that judged it
    passing = sorted((int(n.rsplit("float", 1)[1]), n) for n, s in mixed.items() if s >= 0.95)
    assert passing, mixed  # a float set met the bar, confirmed by the task metric
    missing = [int(n.rsplit("float", 1)[1]) for n, s in mixed.items() if s < 0.95]
    assert (
        passing[0][0] == 1 or passing[0][0] - 1 in missing
    )  # one fewer layer in float misses: the smallest passing set is kept
    if "-float" in manifest.recipe.name:  # it ships unless FP32 ran faster here: its float layers are recorded
        assert manifest.recipe.name == passing[0][1]
        (record,) = [p for p in manifest.recipe.passes if p.name == "int8-static-qdq"]
        (ranking,) = result.worst_layers.values()  # each ranked layer with the nodes that keep it in float
        groups = [name for layer in ranking[: passing[0][0]] for name in layer["float_group"]]  # type: ignore[attr-defined]
        assert record.params["excluded_nodes"] == list(dict.fromkeys(groups))
    else:
        assert manifest.recipe.name == "ort-fp32"


@pytest.mark.slow  # NNCF ranks every quantizer group with one compiled model each
def test_nncf_int8_that_misses_its_bar_ships_after_accuracy_control_driven_by_the_task_metric(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    result, manifest, scores = _convert_outlier(tmp_path, signing_key, "intel-x86-vnni", "openvino")
    assert max(scores["ov-int8-nncf"], scores["ov-int8-nncf-mixed"]) < 0.95  # plain NNCF INT8 misses the bar
    mixed = {n: s for n, s in scores.items() if "nncf-accuracy" in n}
    assert mixed and max(mixed.values()) >= 0.95, scores  # accuracy control met it, judged by the converter's gate
    (judged,) = [n for n in mixed if manifest.search.judged_on[n].startswith("held-out split (16 samples)")]
    assert scores[judged] >= 0.95  # the variant NNCF's selection settled on, judged on samples it never saw
    (note,) = {n.split(": ", 1)[1] for n in result.notes if "NNCF accuracy control kept" in n}
    assert "kept 0 " not in note and "every layer in INT8" not in note  # the float layers are named
    if "nncf-accuracy" in manifest.recipe.name:
        (record,) = [p for p in manifest.recipe.passes if p.name == "nncf-int8-accuracy-control"]
        assert record.params["float_layers"] and record.params["bar"] == 0.95
        assert record.params["selection_samples"] == 16  # NNCF validated on the selection half only
        assert manifest.accuracy.judged_on == manifest.search.judged_on[judged] and manifest.accuracy.samples == 16


def _convert(model_name: str, profile: str, runtimes: tuple[str, ...], tmp_path: Path, key: SigningKey):  # type: ignore[no-untyped-def]
    model = corpus.by_name(model_name)
    calib, evaluation = corpus.dataset(model, tmp_path / "data", count=16)
    (result,) = convert(
        ConvertRequest(
            model=model.path(), profiles=[get_profile(profile)], calib=calib, eval=evaluation, out=tmp_path / "out",
            key=key, name=model.name, version="1", report=False, metric=model.metric, min_score=model.min_score,
            threads=2, runtimes=runtimes,
            prune=False,  # plain INT8 is scored and retried even where it does not beat FP32/bf16 on this CPU
        )
    )  # fmt: skip
    assert result.bundle, result.error
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.search is not None and manifest.accuracy.value >= manifest.search.bar - 1e-9
    return result, manifest


def _plain_int8_misses(scores: dict[str, float], names: list[str], bar: float) -> None:
    plain = {n: scores[n] for n in names if n in scores}
    if not plain or max(plain.values()) >= bar:
        pytest.skip(f"plain INT8 meets the bar {bar} on this CPU: {plain}")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_text_recognizer_whose_nncf_int8_misses_its_bar_tries_accuracy_control_and_ships_above_the_bar(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    """ppocr-rec (CTC logits, Paddle2ONNX): NNCF INT8 misses 0.97 per-timestep agreement."""
    result, manifest = _convert("ppocr-rec", "intel-x86-vnni", ("openvino",), tmp_path, signing_key)
    assert manifest.search is not None and manifest.search.bar == pytest.approx(0.97)
    scores = {n: s for n, s in manifest.search.scores.items() if s is not None}
    _plain_int8_misses(scores, ["ov-int8-nncf", "ov-int8-nncf-mixed"], 0.97)
    mixed = {n: s for n, s in scores.items() if "nncf-accuracy" in n}
    assert mixed, scores  # accuracy control was built and scored with the task metric
    notes = [n for n in result.notes if "NNCF accuracy control kept" in n]
    assert notes, result.notes  # the float layers are in the report
    if "nncf-accuracy" in manifest.recipe.name:  # and in the manifest when it ships
        record = next(p for p in manifest.recipe.passes if p.name == "nncf-int8-accuracy-control")
        assert record.params["float_layers"] and record.params["bar"] == pytest.approx(0.97)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_text_recognizer_whose_ort_int8_misses_its_bar_searches_the_float_set_with_few_builds(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    """ppocr-rec on ONNX Runtime: static INT8 misses 0.97 per-timestep agreement with every calibration."""
    result, manifest = _convert("ppocr-rec", "generic-x86-64", ("onnxruntime",), tmp_path, signing_key)
    assert manifest.search is not None
    scores = {n: s for n, s in manifest.search.scores.items() if s is not None}
    plain = [n for n in scores if n.startswith("ort-int8-static") and "float" not in n]
    _plain_int8_misses(scores, plain, manifest.search.bar)
    (summary,) = [n for n in result.notes if n.startswith("ORT exclusion search over")]
    ranked, builds = int(summary.split(" over ")[1].split()[0]), int(summary.split(", ")[1].split()[0])
    assert builds <= 2 * math.ceil(math.log2(ranked)) + 1  # about 2·log2(n) builds, never one per layer
    assert any("-float" in n for n in scores)  # each float set was scored with the task metric
    if "-float" in manifest.recipe.name:  # the float-kept layers are in the manifest
        (record,) = [p for p in manifest.recipe.passes if p.name == "int8-static-qdq"]
        assert record.params["excluded_nodes"]
