"""Generative bundles on the device's real runtimes (ONNX Runtime GenAI, OpenVINO GenAI), from the converter's
signed tinylm bundles: load and provider choice, the golden check, streaming and cancellation, stop strings, the
signed-file rule for a model folder, and the drain that lets streams finish before a replaced model closes.

The session's tinylm bundles are the converter's choice by speed here (ONNX Runtime GenAI on this machine, for both
profiles); an OpenVINO GenAI bundle is converted for this module (`--runtime openvino-genai`), so both runtimes
are served."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.agent.install.signed_files import check_bundle_files
from edgefleet.agent.runtime import LoadedModel, NoProviderError
from edgefleet.agent.runtime.generative import GenerationRequest, Retired, Stopper
from edgefleet.core.errors import BundleError, DataError
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.trust.signing import SigningKey

from support.generation import SlowSession, scramble, weights_file
from support.models.generative import TinylmBundles, convert_tinylm
from support.runtime import unpack

pytestmark = pytest.mark.slow  # the session's tinylm conversion (about a minute) comes first

RUNTIMES = ("onnxruntime-genai", "openvino-genai")


@pytest.fixture(scope="module")
def bundles(
    tinylm_bundles: TinylmBundles, signing_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """runtime → a signed tinylm bundle for it."""
    out = tmp_path_factory.mktemp("tinylm-openvino")
    (result,) = convert_tinylm(out, signing_key, ("intel-x86-vnni",), runtimes=("openvino-genai",))
    assert result.bundle, result.error
    assert tinylm_bundles.manifest("generic-x86-64").format == "onnx-genai"  # the profile's only runtime
    return {"onnxruntime-genai": tinylm_bundles["generic-x86-64"], "openvino-genai": Path(str(result.bundle))}


@pytest.fixture(scope="module")
def models(
    bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LoadedModel]]:
    root = tmp_path_factory.mktemp("generative")
    loaded = {r: LoadedModel(*unpack(bundles[r], keys[1], root / r), 2) for r in RUNTIMES}
    yield loaded
    for model in loaded.values():
        model.close()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_bundle_loads_on_its_runtime_and_passes_its_golden_prompts(
    runtime: str, models: dict[str, LoadedModel]
) -> None:
    model = models[runtime]
    manifest = model.manifest
    assert model.generative is not None and manifest.generation is not None
    assert model.provider in manifest.providers and model.provider.startswith(runtime + ":")
    session = model.generative.session.describe()
    assert session["runtime"] == runtime
    for key, value in manifest.generation.runtime_config.items():  # what the build was judged with holds here
        assert session[key] == str(value)
    assert "time per output token on the golden prompts" in model.choice.summary
    golden = model.check_golden()
    assert golden.passed, golden.reason
    floors = GoldenPrompts.load(model.bundle_dir / manifest.generation.golden)
    assert golden.agreement >= floors.min_next_token_agreement
    assert {s.output for s in golden.scores} == {"next-token", "perplexity", "continuation"}
    assert golden.task is not None and golden.task.metric == "next-token-agreement"
    with pytest.raises(DataError, match="generative model: use its generate endpoints"):
        model.run({})


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_streamed_pieces_are_the_answer_and_a_stopper_cuts_it(runtime: str, models: dict[str, LoadedModel]) -> None:
    model = models[runtime].generative
    assert model is not None
    ids = tuple(model.encode("def parse(self, args):\n    "))
    pieces: list[str] = []
    whole = model.generate(GenerationRequest(ids, 24, ignore_stop=True), pieces.append)
    assert len(whole.tokens) == 24 and whole.finish_reason == "length"
    assert "".join(pieces) == whole.text == model.decode(list(whole.tokens))
    assert whole.ttft_ms > 0 and whole.tpot_ms is not None and whole.tpot_ms > 0
    stopper, seen = Stopper(), []

    def cut_after_three(piece: str) -> None:
        seen.append(piece)
        if len(seen) == 3:
            stopper.stop("cancelled", "the test")

    cut = model.generate(GenerationRequest(ids, 24, ignore_stop=True), cut_after_three, stopper=stopper)
    assert cut.finish_reason == "cancelled" and cut.cancelled_by == "the test" and len(cut.tokens) < 24
    stop = whole.text[len(whole.text) // 2 :][:3]
    halted = model.generate(GenerationRequest(ids, 24, ignore_stop=True), lambda _p: None, stop_strings=[stop])
    assert halted.finish_reason == "stop" and whole.text.startswith(halted.text) and stop not in halted.text


def test_damaged_weights_fail_the_golden_prompts(
    bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle_dir, manifest = unpack(bundles["onnxruntime-genai"], keys[1], tmp_path / "ort")
    scramble(bundle_dir / weights_file(manifest))  # the model loads and answers: only its answers are wrong
    with pytest.raises(NoProviderError, match="outputs leave the golden tolerance: golden prompts fail"):
        LoadedModel(bundle_dir, manifest, 2)
    bundle_dir, manifest = unpack(bundles["openvino-genai"], keys[1], tmp_path / "ov")
    scramble(bundle_dir / weights_file(manifest))  # an IR's .bin holds shapes too: OpenVINO may refuse to load it
    with pytest.raises(NoProviderError, match=r"golden prompts fail|load failed"):
        LoadedModel(bundle_dir, manifest, 2)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_model_folder_holds_nothing_but_signed_files(
    runtime: str, bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle_dir, manifest = unpack(bundles[runtime], keys[1], tmp_path / "b")
    assert manifest.generation is not None
    check_bundle_files(bundle_dir, manifest)
    folder = bundle_dir / manifest.generation.model_dir
    extra = folder / "added_tokens.json"  # a file the runtime would read, not signed
    extra.write_text("{}")
    with pytest.raises(BundleError, match=r"added_tokens\.json.*not in the bundle's signed file list"):
        check_bundle_files(bundle_dir, manifest)
    extra.unlink()
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    os.symlink(outside, folder / "special_tokens_map.json.link")
    with pytest.raises(BundleError, match="not a regular file"):
        check_bundle_files(bundle_dir, manifest)
    (folder / "special_tokens_map.json.link").unlink()
    if manifest.format == "onnx-genai":  # the config names the ONNX file the runtime opens: it must be signed too
        config = folder / "genai_config.json"
        config.write_text(config.read_text().replace('"filename": "model.onnx"', '"filename": "../../escape.onnx"'))
        with pytest.raises(BundleError, match=r"escape\.onnx"):
            check_bundle_files(bundle_dir, manifest)


def test_a_drain_lets_generations_finish_then_cuts_what_outlives_it(
    tinylm_bundles: TinylmBundles, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    model = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path / "d"), 2)
    generative = model.generative
    assert generative is not None
    slow = SlowSession(generative.session, 0.02)
    generative.session = slow
    ids = tuple(generative.encode("class Reader:\n    "))
    results = []

    def run(tokens: int) -> None:
        results.append(generative.generate(GenerationRequest(ids, tokens, ignore_stop=True), lambda _p: None))

    short = threading.Thread(target=run, args=(10,))  # about 0.2 s: finishes within the drain
    short.start()
    assert slow.started.wait(10)
    assert model.drain(5.0) == 0
    short.join(5)
    assert results[0].finish_reason == "length" and len(results[0].tokens) == 10
    with pytest.raises(Retired):  # a drained model takes nothing new
        generative.generate(GenerationRequest(ids, 2), lambda _p: None)
    model.close()

    model = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path / "e"), 2)
    generative = model.generative
    assert generative is not None
    slow = SlowSession(generative.session, 0.02)
    generative.session = slow
    long = threading.Thread(target=run, args=(200,))  # about 4 s: outlives a 0.3 s drain
    long.start()
    assert slow.started.wait(10)
    start = time.monotonic()
    assert model.drain(0.3) == 1
    long.join(5)
    assert time.monotonic() - start < 3
    assert results[1].finish_reason == "cancelled" and "drain" in results[1].cancelled_by
    assert 0 < len(results[1].tokens) < 200
    model.close()


def test_a_quiet_device_probes_its_golden_prompts(models: dict[str, LoadedModel]) -> None:
    from edgefleet.agent.quality.probe import ProbeConfig, Prober
    from edgefleet.agent.telemetry import RequestStats

    stats = RequestStats()
    prober = Prober(lambda: models["onnxruntime-genai"], stats, ProbeConfig(rate=1.0))
    assert prober.probe_once() and prober.probe_once()
    latency, requests, _, _ = stats.snapshot()
    window = stats.generation.snapshot()
    assert requests == 0 and window.streams == 0 and window.probe_streams == 2  # probes are not clients' requests
    assert latency.count == 2 and window.tpot is not None and latency.p50_ms == pytest.approx(window.tpot.p50_ms)
    assert stats.take_probes() == 2
