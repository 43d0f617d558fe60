"""LoadedModel: the API the daemon and installer use, input validation, thread safety, OpenVINO IR bundles."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.runtime.selection.trial import load_options
from edgefleet.core.bundle.archive import describe_files
from edgefleet.core.bundle.manifest import Manifest, PassRecord, Recipe
from edgefleet.core.errors import DataError

from support.runtime import golden, symbolic_batch, unpack, with_providers


@pytest.fixture(scope="module")
def digits(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    return unpack(demo_bundles["generic-x86-64"], keys[1], tmp_path_factory.mktemp("model") / "bundle")


def test_the_api_the_daemon_and_installer_use(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, manifest = digits
    model = LoadedModel(bundle_dir, manifest, 1)  # the installer's call, positional
    assert model.provider == "CPUExecutionProvider" and model.bundle_id == manifest.bundle_id
    assert model.manifest is manifest and model.load_ms > 0 and isinstance(model.choice.reasons, dict)
    assert model.last_golden is None
    result = model.check_golden()
    assert result.passed and model.last_golden is result
    model.bundle_dir = tmp_path  # the daemon points it at the committed directory
    assert model.bundle_dir == tmp_path


def test_run_validates_names_dtypes_and_shapes(digits: tuple[Path, Manifest]) -> None:
    bundle_dir, manifest = digits
    model = LoadedModel(bundle_dir, manifest, 1)
    x = golden(bundle_dir, manifest).inputs.sample(0)["input"]
    assert model.run({"input": x})["logits"].shape == (1, 10)
    bad = {
        "wrong name": {"pixels": x},
        "extra input": {"input": x, "more": x},
        "wrong dtype": {"input": x.astype(np.float64)},
        "wrong rank": {"input": x[0]},
        "wrong dimension": {"input": np.zeros((1, 1, 8, 9), np.float32)},
        "not an array": {"input": x.tolist()},
    }
    for case, feeds in bad.items():
        with pytest.raises(DataError):
            model.run(feeds)  # type: ignore[arg-type]
        assert case


def test_symbolic_dimensions_accept_any_size(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, dynamic = symbolic_batch(*digits, tmp_path / "dyn")
    model = LoadedModel(bundle_dir, dynamic, 1)
    assert model.run({"input": np.zeros((3, 1, 8, 8), np.float32)})["logits"].shape == (3, 10)
    with pytest.raises(DataError, match="dimension 2 is 7"):
        model.run({"input": np.zeros((3, 1, 7, 8), np.float32)})


def test_run_is_thread_safe(digits: tuple[Path, Manifest]) -> None:
    bundle_dir, manifest = digits
    model = LoadedModel(bundle_dir, manifest, 1)
    samples = golden(bundle_dir, manifest).inputs
    expected = [model.run(samples.sample(i))["logits"] for i in range(8)]
    failures: list[str] = []

    def worker(offset: int) -> None:
        for step in range(200):
            index = (offset + step) % 8
            if not np.array_equal(model.run(samples.sample(index))["logits"], expected[index]):
                failures.append(f"sample {index}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


F32 = ("<Type: 'float32'>", "f32", "float32")


def _ir_bundle(digits: tuple[Path, Manifest], dest: Path, recipe: Recipe) -> tuple[Path, Manifest]:
    """The bundle's model as OpenVINO IR (its golden set still holds), labelled with the recipe the test names:
    the hint follows the recipe, whichever recipe the converter picked on this CPU."""
    import openvino as ov

    bundle_dir, manifest = digits
    (dest / "model").mkdir(parents=True)
    ov.save_model(ov.convert_model(str(bundle_dir / manifest.model_path)), str(dest / "model" / "model.xml"))
    (dest / "golden.npz").write_bytes((bundle_dir / "golden.npz").read_bytes())
    files = {p: dest / p for p in ("model/model.xml", "model/model.bin", "golden.npz")}
    ir = with_providers(manifest, "openvino:CPU", "CPUExecutionProvider").model_copy(
        update={"format": "openvino-ir", "model_path": "model/model.xml", "files": describe_files(files),
                "recipe": recipe}
    )  # fmt: skip
    return dest, ir


def test_an_openvino_ir_bundle_runs_on_the_openvino_runtime(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    """An FP32 bundle runs in f32: OpenVINO's CPU default is bf16 wherever the CPU has AVX-512 BF16 or AMX."""
    ir_dir, ir = _ir_bundle(digits, tmp_path / "ir", Recipe(name="fp32", precision="fp32", runtime="openvino"))
    model = LoadedModel(ir_dir, ir, 1, cache_dir=tmp_path / "cache")
    assert model.provider == "openvino:CPU"
    assert "cannot load openvino-ir bundles" in model.choice.reasons["CPUExecutionProvider"]
    assert model.check_golden().passed
    assert model.session.describe()["INFERENCE_PRECISION_HINT"] in F32


def test_an_int8_bundle_runs_its_float_layers_with_the_hint_the_converter_measured(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    pinned = Recipe(name="int8-static-qdq", precision="int8-static", runtime="openvino",
                    passes=[PassRecord(name="openvino-ir", params={"inference_precision_hint": "f32"})])  # fmt: skip
    ir_dir, ir = _ir_bundle(digits, tmp_path / "pinned", pinned)
    model = LoadedModel(ir_dir, ir, 1, cache_dir=tmp_path / "cache")
    assert model.provider == "openvino:CPU" and model.check_golden().passed
    assert model.session.describe()["INFERENCE_PRECISION_HINT"] in F32
    # the rule itself, on any CPU: only FP32 recipes and recipes measured with the f32 hint are pinned
    free = pinned.model_copy(update={"passes": [PassRecord(name="openvino-ir", params={})]})
    assert load_options(ir, 1, None, None, ()).float_f32
    assert load_options(ir.model_copy(update={"recipe": free}), 1, None, None, ()).float_f32 is False
