"""CoreML bundles (apple-silicon): ONNX → onnx2torch → coremltools ML Program. On Linux: the package saves and
reloads, its spec lists the model's inputs and outputs, the torch path matches ONNX Runtime on the evaluation set,
every file of the .mlpackage is pinned, and an agent off macOS refuses the bundle before download. Prediction
needs macOS: only that test skips elsewhere."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edgefleet.agent.install.installer import Refused, check_runnable
from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.runners import ort_runner, predict
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest, unpack_bundle, verify_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.tensors import load_dataset
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.paths import DIGITS
from support.slots import slot_of

pytestmark = pytest.mark.slow  # a CoreML conversion through torch for the module: ~25 s on 2 cores


@pytest.fixture(scope="module")
def coreml_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """The digits CNN for apple-silicon's CoreML target, once per precision the profile lists."""
    if cml.missing_packages():
        pytest.fail(f"{cml.missing_packages()}: install the host's CoreML build dependencies (see pyproject extras)")
    out = tmp_path_factory.mktemp("coreml")
    apple = get_profile("apple-silicon")
    coreml_target = apple.targets[0]
    assert coreml_target.runtime == "coreml"
    found = {}
    for precision in coreml_target.precisions:
        profile = apple.model_copy(update={"targets": [coreml_target.model_copy(update={"precisions": [precision]})]})
        (result,) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[profile], calib=DIGITS / "calib.npz",
                eval=DIGITS / "eval.npz", out=out / precision, key=signing_key, name="digits", version="1",
                report=False,
            )
        )  # fmt: skip
        assert result.bundle and result.format == "coreml", result.error
        found[precision] = Path(result.bundle)
    return found


def _manifest(bundle: Path) -> Manifest:
    return parse_manifest(read_signed_manifest(bundle).manifest_json)


def test_a_coreml_bundle_pins_every_file_of_its_mlpackage(
    coreml_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle = coreml_bundles["fp16"]
    manifest = verify_bundle(bundle, TrustedKeys.load([keys[1]]))
    assert manifest.format == "coreml" and manifest.model_path == "model/model.mlpackage"
    assert manifest.providers == ["coreml:ALL"] and manifest.recipe.precision == "fp16"
    unpacked = tmp_path / "b"
    unpack_bundle(bundle, unpacked, TrustedKeys.load([keys[1]]))
    on_disk = {p.relative_to(unpacked).as_posix() for p in (unpacked / manifest.model_path).rglob("*") if p.is_file()}
    pinned = {f.path for f in manifest.files if f.path.startswith("model/model.mlpackage/")}
    assert (
        on_disk == pinned
        and {
            "model/model.mlpackage/Manifest.json",
            "model/model.mlpackage/Data/com.apple.CoreML/model.mlmodel",
            "model/model.mlpackage/Data/com.apple.CoreML/weights/weight.bin",
        }
        <= pinned
    )
    passes = {p.name: p.params for p in manifest.recipe.passes}
    assert passes["coreml-mlprogram"]["convert_to"] == "mlprogram"
    assert passes["coreml-mlprogram"]["compute_precision"] == "float16"
    assert manifest.golden.max_abs_error > 0.01  # CoreML's FP16 kernels against torch's FP16 emulation


def test_the_package_reloads_and_its_spec_lists_the_models_inputs_and_outputs(
    coreml_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    ct = cml.coremltools()
    for precision, bundle in coreml_bundles.items():
        unpacked = tmp_path / precision
        manifest = unpack_bundle(bundle, unpacked, TrustedKeys.load([keys[1]]))
        spec = ct.models.MLModel(str(unpacked / manifest.model_path), skip_model_load=True).get_spec()
        inputs = {i.name: list(i.type.multiArrayType.shape) for i in spec.description.input}
        outputs = [o.name for o in spec.description.output]
        assert inputs == {"input": [1, 1, 8, 8]} and outputs == ["logits"], precision
        assert spec.WhichOneof("Type") == "mlProgram"
        assert manifest.inputs[0].shape == [1, 1, 8, 8] and manifest.outputs[0].name == "logits"


def test_the_torch_path_matches_onnxruntime_on_the_evaluation_set(coreml_bundles: dict[str, Path]) -> None:
    model = onnx.load(str(DIGITS / "digits_cnn.onnx"))
    evaluation = load_dataset(DIGITS / "eval.npz", [cml_input()], role="evaluation")
    reference = predict(ort_runner(DIGITS / "digits_cnn.onnx"), evaluation)
    module = cml.to_torch(model)
    exact = predict(cml.torch_runner(module, [cml_input()], ["logits"], cml.CoreMLConfig("fp32")), evaluation)
    assert np.abs(exact["logits"] - reference["logits"]).max() < 1e-4
    half = predict(cml.torch_runner(module, [cml_input()], ["logits"], cml.CoreMLConfig("fp16")), evaluation)
    assert (half["logits"].argmax(-1) == reference["logits"].argmax(-1)).mean() > 0.99
    recorded = {p.name: p.params for p in _manifest(coreml_bundles["fp16"]).recipe.passes}["onnx2torch"]
    assert float(recorded["max_abs_vs_onnxruntime"]) < 1e-4  # type: ignore[arg-type]


def cml_input() -> Any:
    from edgefleet.core.bundle.manifest import TensorSpec

    return TensorSpec(name="input", dtype="float32", shape=[1, 1, 8, 8])


def test_int8_weight_quantization_shrinks_the_weights_and_stays_in_budget(
    coreml_bundles: dict[str, Path],
) -> None:
    fp16, int8 = _manifest(coreml_bundles["fp16"]), _manifest(coreml_bundles["int8-weights"])
    weights = "model/model.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
    assert int8.file(weights).size < fp16.file(weights).size
    assert int8.recipe.precision == "int8-weights"
    assert int8.accuracy.passed and int8.accuracy.value >= int8.accuracy.reference - int8.accuracy.budget
    fp32 = _manifest(coreml_bundles["fp32"])
    assert fp32.file(weights).size > fp16.file(weights).size
    assert {p.name: p.params for p in fp32.recipe.passes}["coreml-mlprogram"]["compute_precision"] == "float32"


def test_weight_emulation_rounds_like_coremltools() -> None:
    import torch

    layer = torch.nn.Conv2d(16, 32, 3)
    quantized = cml.fake_quantize_weights(layer, threshold=0)
    weight = quantized.weight.detach().reshape(32, -1)
    steps = weight / (layer.weight.detach().reshape(32, -1).abs().amax(dim=1, keepdim=True) / 127)
    assert torch.allclose(steps, steps.round(), atol=1e-3), "every weight on its channel's 255-level grid"
    untouched = cml.fake_quantize_weights(layer, threshold=10**9)
    assert torch.equal(untouched.weight, layer.weight), "tensors under the threshold stay float, as in coremltools"


@pytest.mark.skipif(platform.system() != "Darwin", reason="CoreML prediction needs macOS; Linux checks the rest")
def test_on_macos_the_agent_runtime_predicts_with_coreml_and_passes_the_golden_set(
    coreml_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from edgefleet.agent.runtime.model import LoadedModel

    unpacked = tmp_path / "b"
    manifest = unpack_bundle(coreml_bundles["fp16"], unpacked, TrustedKeys.load([keys[1]]))
    model = LoadedModel(unpacked, manifest, cache_dir=tmp_path / "cache")
    assert model.provider == "coreml:ALL" and model.check_golden().passed


def test_off_macos_a_coreml_bundle_is_refused_with_the_reason(coreml_bundles: dict[str, Path]) -> None:
    if platform.system() == "Darwin":
        pytest.skip("on macOS CoreML bundles run")
    with pytest.raises(Refused, match=r"coreml:ALL: CoreML runs only on macOS \(this is linux\)"):
        check_runnable(_manifest(coreml_bundles["fp16"]))


def test_missing_build_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx2torch" else real(name))
    assert "onnx2torch (pip install --no-deps)" in (cml.missing_packages() or "")


def test_an_agent_off_macos_refuses_a_coreml_bundle_before_download(
    coreml_bundles: dict[str, Path], start_agent: Callable[..., AgentProcess], host: Connection, topics: Topics,
    watcher: FleetWatcher,
) -> None:  # fmt: skip
    if platform.system() == "Darwin":
        pytest.skip("on macOS CoreML bundles run")
    agent = start_agent("dev-mac", profile="apple-silicon")
    bundle_id = deploy_to(host, topics, coreml_bundles["fp16"], devices=("dev-mac",))
    event = watcher.event("dev-mac", "refused", bundle_id=bundle_id)
    assert "CoreML runs only on macOS" in event.detail
    assert not any(e.kind == "download-started" for e in watcher.events if e.device_id == "dev-mac")
    error = watcher.wait_for("the reason in the status", lambda: slot_of(watcher.status.get("dev-mac")).last_error)
    assert "CoreML runs only on macOS" in error and agent.alive


def test_a_users_own_torch_model_replaces_onnx2torch_and_is_checked_against_onnxruntime(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    import torch

    class Wrong(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(2, 3)).repeat(1, 10)

    example = (torch.zeros(1, 1, 8, 8),)
    module = cml.to_torch(onnx.load(str(DIGITS / "digits_cnn.onnx")))
    good, bad = tmp_path / "digits.pt2", tmp_path / "zeros.pt2"
    torch.export.save(torch.export.export(module, example), str(good))  # torch.export: TorchScript is deprecated
    torch.export.save(torch.export.export(Wrong(), example), str(bad))
    apple = get_profile("apple-silicon")
    profile = apple.model_copy(update={"targets": [apple.targets[0].model_copy(update={"precisions": ["fp16"]})]})
    results = {}
    for model in (good, bad):
        (results[model.name],) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[profile], calib=DIGITS / "calib.npz",
                eval=DIGITS / "eval.npz", out=tmp_path / model.stem, key=signing_key, name="digits", version="1",
                report=False, torch_model=model,
            )
        )  # fmt: skip
    assert results["digits.pt2"].bundle, results["digits.pt2"].error
    recorded = {p.name: p.params for p in _manifest(Path(results["digits.pt2"].bundle)).recipe.passes}
    assert recorded["torch-model"]["file"] == "digits.pt2" and "onnx2torch" not in recorded
    assert results["zeros.pt2"].bundle is None
    assert "the torch model zeros.pt2 differs from ONNX Runtime" in str(results["zeros.pt2"].candidates[0]["error"])
