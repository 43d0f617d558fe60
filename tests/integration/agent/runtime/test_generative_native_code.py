"""A language-model bundle never makes the agent load native code, with real ONNX Runtime GenAI: a tinylm bundle,
re-signed with the bundle key alone, carries a library whose constructor writes a marker file and names it as its
custom-op library, in genai_config.json or in the manifest's generation.runtime_config. ONNX Runtime GenAI itself
runs the constructor (shown first, in a separate process); the agent refuses the bundle with the reason, on the
install's checks and in the backend's own, and the constructor never runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.agent.install.signed_files import check_bundle_files, check_manifest_paths
from edgefleet.agent.runtime import LoadedModel, NoProviderError, native_code
from edgefleet.core.errors import BundleError
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.models.generative import TinylmBundles
from support.native_library import MARKER_ENV, constructor_library, custom_ops_library, resigned_with
from support.runtime import unpack

pytestmark = pytest.mark.slow  # the session's tinylm conversion (about a minute) comes first

REFUSAL = "'custom_ops_library' loads a native library into the agent"


@pytest.fixture
def library(tmp_path: Path) -> Path:
    return constructor_library(tmp_path / "attacker")


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the library's constructor writes if it ever runs (in this process or a child)."""
    path = tmp_path / "constructor-ran"
    monkeypatch.setenv(MARKER_ENV, str(path))
    return path


def test_onnxruntime_genai_itself_runs_the_library_a_genai_config_names(
    tinylm_bundles: TinylmBundles, signing_key: SigningKey, trusted: TrustedKeys, keys: tuple[Path, Path],
    library: Path, marker: Path, tmp_path: Path,
) -> None:  # fmt: skip
    """The attack is real: handed the folder as is, ONNX Runtime GenAI loads the library (its constructor runs) and
    only then fails to find its registration function. Run in a child process, so this one never maps it."""
    bundle = resigned_with(tinylm_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "2", library=library,
                           edit_config=custom_ops_library(library.name))  # fmt: skip
    bundle_dir, manifest = unpack(bundle, keys[1], tmp_path / "unpacked")
    assert manifest.generation is not None
    folder = bundle_dir / manifest.generation.model_dir
    script = (
        "import sys, onnxruntime_genai as og\ntry:\n    og.Model(og.Config(sys.argv[1]))\nexcept Exception:\n    pass"
    )
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, timeout=120)
    assert marker.read_text() == "the library's constructor ran\n"


def test_a_genai_config_naming_a_custom_ops_library_is_refused_and_its_code_never_runs(
    tinylm_bundles: TinylmBundles, signing_key: SigningKey, trusted: TrustedKeys, keys: tuple[Path, Path],
    library: Path, marker: Path, tmp_path: Path,
) -> None:  # fmt: skip
    bundle = resigned_with(tinylm_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "2", library=library,
                           edit_config=custom_ops_library(library.name))  # fmt: skip
    bundle_dir, manifest = unpack(bundle, keys[1], tmp_path / "unpacked")
    loaded_before = native_code.loads()
    check_manifest_paths(manifest)  # the manifest alone says nothing: the config is a file of the bundle
    with pytest.raises(BundleError, match=REFUSAL) as refused:  # the install's check of the unpacked files
        check_bundle_files(bundle_dir, manifest)
    assert "genai_config.json model.decoder.session_options" in str(refused.value)
    with pytest.raises(NoProviderError, match=REFUSAL):  # the backend checks again before ONNX Runtime GenAI reads it
        LoadedModel(bundle_dir, manifest, 2)
    assert not marker.exists()
    assert native_code.loads() == loaded_before  # nothing native was handed to a runtime


@pytest.mark.parametrize("where", ["absolute path", "file of the bundle"])
def test_a_runtime_config_naming_a_custom_ops_library_is_refused_and_its_code_never_runs(
    where: str, tinylm_bundles: TinylmBundles, signing_key: SigningKey, trusted: TrustedKeys,
    keys: tuple[Path, Path], library: Path, marker: Path, tmp_path: Path,
) -> None:  # fmt: skip
    """generation.runtime_config becomes the decoder's session options (Config.overlay): the same setting."""
    name = str(library) if where == "absolute path" else library.name
    bundle = resigned_with(tinylm_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "3", library=library,
                           runtime_config={"custom_ops_library": name})  # fmt: skip
    bundle_dir, manifest = unpack(bundle, keys[1], tmp_path / "unpacked")
    loaded_before = native_code.loads()
    with pytest.raises(BundleError, match=f"generation.runtime_config: {REFUSAL}"):  # before a block is downloaded
        check_manifest_paths(manifest)
    with pytest.raises(NoProviderError, match=REFUSAL):
        LoadedModel(bundle_dir, manifest, 2)
    assert not marker.exists()
    assert native_code.loads() == loaded_before  # nothing native was handed to a runtime


def test_the_converters_bundle_passes_every_check_and_loads(
    tinylm_bundles: TinylmBundles, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """What the converter writes is on the allow-list: its genai_config.json and runtime_config pass unchanged."""
    bundle_dir, manifest = unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path / "good")
    check_manifest_paths(manifest)
    check_bundle_files(bundle_dir, manifest)
    model = LoadedModel(bundle_dir, manifest, 2)
    assert model.check_golden().passed
    model.close()


def test_a_provider_its_profile_does_not_allow_is_refused_from_the_manifest_alone(
    tinylm_bundles: TinylmBundles,
) -> None:
    manifest = tinylm_bundles.manifest("generic-x86-64")
    check_manifest_paths(manifest)
    elsewhere = manifest.model_copy(update={"providers": ["onnxruntime-genai:cpu", "onnxruntime-genai:cuda"]})
    with pytest.raises(BundleError, match="'onnxruntime-genai:cuda' is not one profile generic-x86-64 allows"):
        check_manifest_paths(elsewhere)
