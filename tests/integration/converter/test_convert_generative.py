"""Language models: models/tinylm converted for generic-x86-64 and intel-x86-vnni (tests/support/models/generative.py,
once per session), the bundles verified and their golden prompts replayed, and a strict bar that refuses INT4.

The user errors at the end fail before anything heavy is imported or written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgefleet.converter import ConvertRequest, ProfileResult, convert
from edgefleet.converter.generative.golden import GoldenReference, own_figures
from edgefleet.converter.generative.runtimes import GenerativeRunner, TimedGeneration, open_runner
from edgefleet.core.bundle.archive import unpack_bundle, verify_bundle
from edgefleet.core.bundle.manifest import GENERATIVE_FORMATS
from edgefleet.core.errors import DataError, UserInputError
from edgefleet.core.profiles import HostFacts, get_profile
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.models.generative import BUDGET_S, CALIB, HELDOUT, MODEL_DIR, PROFILES, TinylmBundles, convert_tinylm

ENTRY = {"onnx-genai": "model/genai_config.json", "openvino-genai": "model/openvino_model.xml"}
FORMAT = {"onnxruntime-genai": "onnx-genai", "openvino-genai": "openvino-genai"}


@pytest.mark.slow
def test_a_signed_generative_bundle_per_profile(tinylm_bundles: TinylmBundles, trusted: TrustedKeys) -> None:
    assert set(tinylm_bundles.bundles) == set(PROFILES)
    for profile in PROFILES:
        manifest = verify_bundle(tinylm_bundles[profile], trusted)
        assert manifest.profile == profile and manifest.format in GENERATIVE_FORMATS
        generation = manifest.generation
        assert generation is not None
        assert generation.runtime == manifest.recipe.runtime
        assert (
            manifest.format
            == {"onnxruntime-genai": "onnx-genai", "openvino-genai": "openvino-genai"}[generation.runtime]
        )
        files = {f.path for f in manifest.files}
        assert manifest.model_path == ENTRY[manifest.format] and manifest.model_path in files
        assert set(generation.tokenizer_files) <= files and "model/tokenizer.json" in files
        assert all(p == "golden_prompts.json" or p.startswith("model/") for p in files)
        assert generation.golden == manifest.golden.path == "golden_prompts.json"
        assert (generation.eos_token_ids, generation.vocab_size, generation.context_length) == ([0], 1024, 256)
        assert [(t.name, t.dtype) for t in manifest.inputs] == [("input_ids", "int64")]
        assert manifest.outputs[0].shape == ["batch", "sequence", 1024]
        assert manifest.accuracy.metric == "next-token-agreement" and manifest.accuracy.passed
        assert manifest.recipe.passes, "the recipe names the builder and its parameters"
        if generation.runtime == "openvino-genai":  # judged and timed with these: the device applies the same
            assert generation.runtime_config["INFERENCE_PRECISION_HINT"] in ("f32", "bf16")


@pytest.mark.slow
def test_quality_is_inside_the_default_bars(tinylm_bundles: TinylmBundles) -> None:
    for profile in PROFILES:
        generation = tinylm_bundles.manifest(profile).generation
        assert generation is not None
        quality = generation.quality
        assert (quality.max_perplexity_ratio, quality.min_next_token_agreement) == (1.05, 0.80)
        assert quality.passed and quality.tokens >= 4000
        assert 25 < quality.reference_perplexity < 35  # tinylm's FP32 perplexity on its held-out text: ~30.4


@pytest.mark.slow
def test_every_candidate_is_scored_and_every_other_one_says_why(tinylm_bundles: TinylmBundles) -> None:
    for profile in PROFILES:
        result = tinylm_bundles.results[profile]
        names = {str(c["name"]) for c in result.candidates}
        assert {"ort-fp32", "ort-int8", "ort-int4-rtn", "ort-int4-gptq"} <= names
        if profile == "intel-x86-vnni":  # bf16 only where this CPU computes it (AVX512_BF16 / AMX)
            assert {"ov-fp32", "ov-int8", "ov-int4", "ov-int4-awq"} <= names
            assert ("ov-bf16" in names) == bool(HostFacts.probe().cpu_flags & {"avx512_bf16", "amx_bf16"})
        chosen = [c for c in result.candidates if c["chosen"]]
        assert [c["name"] for c in chosen] == [result.recipe]
        for cand in result.candidates:
            assert isinstance(cand["perplexity_ratio"], float) and isinstance(cand["next_token_agreement"], float)
            assert cand["chosen"] or cand["rejected"], cand
        fp32 = next(c for c in result.candidates if c["name"] == "ort-fp32")
        assert fp32["perplexity_ratio"] == pytest.approx(1.0, abs=1e-4) and fp32["next_token_agreement"] > 0.999


@pytest.mark.slow
def test_the_builds_kept_the_time_budget_and_nothing_was_cut(tinylm_bundles: TinylmBundles) -> None:
    """The CLI's default budget for a language model: every build within the build share, in the converter's own
    process (tinylm's weights are far under the size that repays a process per build), and the result says how long
    the whole conversion took (the budget's mechanics, in a process per build: test_generative_build_budget)."""
    for result in tinylm_bundles.results.values():
        assert result.time_budget is not None, result.profile
        assert result.time_budget["budget_s"] == BUDGET_S and result.time_budget["cut"] == []
        assert result.time_budget["builds_in"] == "the converter's process"
        assert 0 < float(str(result.time_budget["seconds"])) < BUDGET_S


def test_each_candidate_says_its_memory_at_the_full_context(tinylm_bundles: TinylmBundles) -> None:
    """Weights plus the KV cache at the model's context (256 tokens for tinylm), per candidate and for the chosen one
    (the arithmetic: tests/unit/converter/generative/test_generative_memory.py)."""
    for result in tinylm_bundles.results.values():
        for row in result.candidates:
            assert row["context_tokens"] == 256 and row["kv_cache_precision"] in ("f32", "u8"), row
            assert float(str(row["memory_mb_at_context"])) > float(str(row["kv_cache_mb_at_context"])) > 0, row
        assert any(f"{result.recipe}: memory at the model's context of 256 tokens" in n for n in result.notes)


def test_token_latency_and_the_bandwidth_limit(tinylm_bundles: TinylmBundles) -> None:
    """Both profiles are this host (as_this_host): TTFT and TPOT measured, the manifest's latency is TPOT, and the
    limit is measured bandwidth / bytes of weights read per token."""
    for profile in PROFILES:
        manifest = tinylm_bundles.manifest(profile)
        generation = manifest.generation
        assert generation is not None and generation.token_latency is not None and generation.limit is not None
        latency, limit = generation.token_latency, generation.limit
        assert (latency.prompt_tokens, latency.output_tokens, latency.threads) == (64, 32, 2)
        assert latency.ttft_ms > 0 and 0 < latency.tpot_ms < 50
        assert manifest.latency is not None and manifest.latency.median_ms == latency.tpot_ms
        assert manifest.latency.p90_ms >= manifest.latency.median_ms
        assert limit.achieved_tokens_per_s == pytest.approx(1000 / latency.tpot_ms)
        assert limit.limit_tokens_per_s == pytest.approx(limit.bandwidth_gb_s * 1e9 / limit.weights_bytes)
        model_bytes = sum(f.size for f in manifest.files if f.path.startswith("model/"))
        assert 100_000 < limit.weights_bytes < model_bytes
        assert 1 < limit.bandwidth_gb_s < 2000


@pytest.mark.slow
def test_golden_prompts_load_and_the_bundle_passes_its_own_floors(
    tinylm_bundles: TinylmBundles, trusted: TrustedKeys, tmp_path: Path
) -> None:
    """Replayed on this host from the unpacked bundle, as a device like it would: the floors hold; the same
    model answering with shuffled token ids (a broken model) falls below them."""
    for profile in PROFILES:
        folder = tmp_path / profile
        manifest = unpack_bundle(tinylm_bundles[profile], folder, trusted)
        generation = manifest.generation
        assert generation is not None
        golden = GoldenPrompts.load(folder / generation.golden)
        assert len(golden.prompts) == manifest.golden.count == 4
        assert manifest.golden.min_agreement == golden.min_next_token_agreement
        assert len(golden.text.ids) == 128 and golden.text.reference_perplexity > 0
        assert all(len(p.ids) == 32 and 1 <= len(p.reference_ids) <= 16 for p in golden.prompts)
        runner = open_runner(generation.runtime, folder / generation.model_dir, 2, tuple(generation.eos_token_ids),
                             generation.runtime_config)  # fmt: skip
        try:
            own = own_figures(runner, _golden_reference(golden))
            assert own.next_token_agreement >= golden.min_next_token_agreement
            assert own.continuation_agreement >= golden.min_continuation_agreement
            assert own.perplexity_ratio <= golden.max_perplexity_ratio
            broken = own_figures(_Shuffled(runner, generation.vocab_size), _golden_reference(golden))
            assert broken.next_token_agreement < golden.min_next_token_agreement
            assert broken.perplexity_ratio > golden.max_perplexity_ratio
        finally:
            runner.close()


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> ProfileResult:
    """generic-x86-64 with a perplexity bar of 1.001 x FP32's."""
    (result,) = convert_tinylm(tmp_path_factory.mktemp("strict"), signing_key, ("generic-x86-64",),
                               max_perplexity_ratio=1.001, report=False)  # fmt: skip
    return result


@pytest.mark.slow
def test_a_strict_perplexity_bar_refuses_int4_and_ships_another(strict: ProfileResult, trusted: TrustedKeys) -> None:
    int4 = [c for c in strict.candidates if c["precision"] == "int4-weights"]
    assert len(int4) == 2
    for cand in int4:
        assert "perplexity" in str(cand["rejected"]) and "over the bar 1.001x" in str(cand["rejected"])
        assert not cand["chosen"]
    assert strict.bundle is not None and strict.recipe in ("ort-int8", "ort-fp32")
    manifest = verify_bundle(Path(strict.bundle), trusted)
    assert manifest.recipe.precision in ("int8-weights", "fp32")
    assert manifest.generation is not None and manifest.generation.quality.max_perplexity_ratio == 1.001


# --- user errors: before anything is written ------------------------------------------------------------------


def _request(tmp_path: Path, key: SigningKey, **options: object) -> ConvertRequest:
    fields: dict[str, object] = {
        "model": MODEL_DIR, "profiles": [get_profile("generic-x86-64")], "calib": CALIB, "eval": HELDOUT,
        "out": tmp_path / "out", "key": key, "name": "tinylm", "version": "1",
    }  # fmt: skip
    return ConvertRequest(**(fields | options))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"max_perplexity_ratio": 0.9}, UserInputError, "max_perplexity_ratio"),
        ({"min_next_token_agreement": 1.5}, UserInputError, "min_next_token_agreement"),
        ({"prompt_tokens": 250, "output_tokens": 32}, UserInputError, "context of 256"),
        ({"eval": CALIB.parent / "missing.txt"}, DataError, "not found"),
    ],
)
def test_user_errors_come_before_any_work(
    tmp_path: Path, signing_key: SigningKey, options: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        convert(_request(tmp_path, signing_key, **options))
    assert not (tmp_path / "out").exists()


def test_a_directory_that_is_no_language_model_is_refused_with_what_to_give(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(UserInputError, match=r"'bert'.*not a decoder-only language model.*supported: .*llama"):
        convert(_request(tmp_path, signing_key, model=folder))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(DataError, match="not readable UTF-8 text"):
        convert(_request(tmp_path, signing_key, eval=binary))


# --- helpers ----------------------------------------------------------------------------------------------------


def _golden_reference(golden: GoldenPrompts) -> GoldenReference:
    return GoldenReference(list(golden.prompts), golden.text)


class _Shuffled:
    """A broken model: the bundle's own runner with its token ids permuted (logits and continuations)."""

    def __init__(self, runner: GenerativeRunner, vocab: int) -> None:
        self.runner = runner
        self.permutation = np.random.default_rng(0).permutation(vocab)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return self.runner.logits(ids)[:, self.permutation]

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        return [int(self.permutation[t]) for t in self.runner.greedy(ids, max_new_tokens)]

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        return self.runner.timed(ids, new_tokens)

    def close(self) -> None:
        self.runner.close()
