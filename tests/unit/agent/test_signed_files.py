"""The signed file list is all a device loads: every path a load would open is checked by the agent itself."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from edgefleet.agent.install.signed_files import check_bundle_files, check_manifest_paths
from edgefleet.agent.runtime.external_data import external_data
from edgefleet.core.bundle.archive import describe_files
from edgefleet.core.bundle.manifest import (
    AccuracyReport,
    BundleFormat,
    CustomOp,
    GoldenSpec,
    Manifest,
    Recipe,
    TensorSpec,
)
from edgefleet.core.errors import BundleError

from support.paths import REPO

DIGITS = REPO / "edgefleet" / "demo_assets" / "digits_cnn.onnx"


def _manifest(root: Path, files: list[str], model_path: str, fmt: BundleFormat = "onnx", **extra: object) -> Manifest:
    return Manifest(
        bundle_id="m-1-p", model_name="m", model_version="1", profile="p", format=fmt, model_path=model_path,
        recipe=Recipe(name="fp32", precision="fp32", runtime="onnxruntime"), providers=["CPUExecutionProvider"],
        opset={"": 17}, inputs=[TensorSpec(name="input", dtype="float32", shape=[1, 4])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[1, 2])],
        files=describe_files({rel: root / rel for rel in files}),
        accuracy=AccuracyReport(metric="top1", value=1, reference=1, budget=0.01, samples=1, passed=True),
        source_sha256=hashlib.sha256().hexdigest(),
        **{"golden": GoldenSpec(count=1, max_abs_error=1e-3, min_agreement=1.0), **extra},
    )  # fmt: skip


def _external_model(root: Path, location: str = "weights.bin") -> onnx.ModelProto:
    """The demo CNN with every initializer in model/weights.bin, then each tensor's location set to `location`."""
    (root / "model").mkdir(parents=True, exist_ok=True)
    model = onnx.load(DIGITS)
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, root / "model" / "model.onnx")  # writes model/weights.bin
    model = onnx.load(root / "model" / "model.onnx", load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, root / "model" / "model.onnx")
    return model


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    _external_model(root)
    (root / "golden.npz").write_bytes(b"golden")
    return root


FILES = ["golden.npz", "model/model.onnx", "model/weights.bin"]


def test_a_bundle_whose_every_loaded_file_is_signed_passes(bundle: Path) -> None:
    check_bundle_files(bundle, _manifest(bundle, FILES, "model/model.onnx"))


@pytest.mark.parametrize(
    ("model_path", "reason"),
    [
        ("/etc/passwd", "not a relative path"),
        ("../../outside/model.onnx", "not a relative path"),
        ("model/../model/model.onnx", "not a relative path"),
        ("./model/model.onnx", "not a relative path"),
        ("model\\model.onnx", "not a relative path"),
        ("C:/model.onnx", "not a relative path"),
        ("model/other.onnx", "not in the bundle's signed file list"),
    ],
)
def test_a_model_path_outside_the_signed_files_is_refused_from_the_manifest_alone(
    bundle: Path, model_path: str, reason: str
) -> None:
    manifest = _manifest(bundle, FILES, model_path)
    with pytest.raises(BundleError, match=reason):
        check_manifest_paths(manifest)
    with pytest.raises(BundleError, match="model_path"):
        check_bundle_files(bundle, manifest)


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("/tmp/outside/weights.bin", "not a relative path"),
        ("../../outside/weights.bin", "not a relative path"),
        ("other.bin", "not in the bundle's signed file list"),
    ],
)
def test_external_data_pointing_outside_the_signed_files_is_refused(tmp_path: Path, location: str, reason: str) -> None:
    root = tmp_path / "bundle"
    _external_model(root, location)
    (root / "golden.npz").write_bytes(b"golden")
    (root / "other.bin").write_bytes(b"x")
    with pytest.raises(BundleError, match=f"external data of tensor 'conv1.weight'.*{reason}"):
        check_bundle_files(root, _manifest(root, FILES, "model/model.onnx"))


def test_external_data_beyond_the_end_of_its_file_is_refused(bundle: Path) -> None:
    weights = bundle / "model" / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(BundleError, match=r"asks for bytes .* which holds 100"):
        check_bundle_files(bundle, _manifest(bundle, FILES, "model/model.onnx"))


@pytest.mark.parametrize("swapped", ["model/model.onnx", "model/weights.bin", "golden.npz"])
def test_a_signed_file_swapped_for_a_link_to_an_identical_copy_outside_is_refused(
    bundle: Path, tmp_path: Path, swapped: str
) -> None:
    """The hashes still match (the copy is identical): only resolving the link shows the file lives elsewhere."""
    manifest = _manifest(bundle, FILES, "model/model.onnx")
    outside = tmp_path / "outside" / Path(swapped).name
    outside.parent.mkdir()
    (bundle / swapped).rename(outside)
    (bundle / swapped).symlink_to(outside)
    with pytest.raises(BundleError, match="symbolic link to outside the bundle"):
        check_bundle_files(bundle, manifest)


def test_a_bundle_folder_reached_through_a_link_is_fine(bundle: Path, tmp_path: Path) -> None:
    """The state directory itself may sit behind a link (/var/lib -> /data): only links inside the bundle count."""
    link = tmp_path / "state-link"
    link.symlink_to(bundle)
    check_bundle_files(link, _manifest(bundle, FILES, "model/model.onnx"))


def test_openvino_weights_beside_the_model_must_be_signed(tmp_path: Path) -> None:
    root = tmp_path / "ir"
    root.mkdir()
    for name, data in (("model.xml", b"<net/>"), ("model.bin", b"w"), ("golden.npz", b"g")):
        (root / name).write_bytes(data)
    check_bundle_files(root, _manifest(root, ["golden.npz", "model.bin", "model.xml"], "model.xml", "openvino-ir"))
    with pytest.raises(
        BundleError, match=re.escape("OpenVINO weights 'model.bin' is not in the bundle's signed file list")
    ):
        check_bundle_files(root, _manifest(root, ["golden.npz", "model.xml"], "model.xml", "openvino-ir"))


def test_every_file_of_a_coreml_package_must_be_signed(tmp_path: Path) -> None:
    root = tmp_path / "coreml"
    package = root / "model.mlpackage" / "Data"
    package.mkdir(parents=True)
    (package / "model.mlmodel").write_bytes(b"m")
    (root / "model.mlpackage" / "Manifest.json").write_bytes(b"{}")
    (root / "golden.npz").write_bytes(b"g")
    files = ["golden.npz", "model.mlpackage/Data/model.mlmodel", "model.mlpackage/Manifest.json"]
    check_bundle_files(root, _manifest(root, files, "model.mlpackage", "coreml"))
    (package / "extra.bin").write_bytes(b"not signed")
    with pytest.raises(
        BundleError, match=re.escape("'model.mlpackage/Data/extra.bin' is not in the bundle's signed file list")
    ):
        check_bundle_files(root, _manifest(root, files, "model.mlpackage", "coreml"))
    (package / "extra.bin").unlink()
    os.symlink("/etc/passwd", package / "weights.bin")
    with pytest.raises(BundleError, match="not a regular file"):
        check_bundle_files(root, _manifest(root, files, "model.mlpackage", "coreml"))


@pytest.mark.parametrize("field", ["drift_reference", "golden"])
def test_the_golden_set_and_drift_reference_must_be_signed_files(bundle: Path, field: str) -> None:
    extra: dict[str, object] = (
        {"drift_reference": "../drift.json"}
        if field == "drift_reference"
        else {"golden": GoldenSpec(path="/tmp/golden.npz", count=1, max_abs_error=1e-3, min_agreement=1.0)}
    )
    manifest = _manifest(bundle, FILES, "model/model.onnx", **extra)
    with pytest.raises(BundleError, match="not a relative path inside the bundle"):
        check_manifest_paths(manifest)


@pytest.mark.parametrize("library", ["../../tmp/evil.so", "/tmp/evil.so", "sub/evil.so", ".."])
def test_a_custom_op_library_is_a_bare_file_name(bundle: Path, library: str) -> None:
    op = CustomOp(domain="com.example", op_type="Evil", version=1, library=library)
    with pytest.raises(BundleError, match="bare file name"):
        check_manifest_paths(_manifest(bundle, FILES, "model/model.onnx", custom_ops=[op]))


def test_external_data_is_read_from_every_subgraph_as_onnx_reads_it(tmp_path: Path) -> None:
    """A tensor in an If branch's initializers and one in a Constant attribute: both found, without onnx."""
    big = numpy_helper.from_array(np.ones((64,), "float32"), "branch_w")
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(32, "float32"), "cv"))
    branch = helper.make_graph([const, helper.make_node("Add", ["c", "branch_w"], ["y"])], "then", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], [big])  # fmt: skip
    node = helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [64])])  # fmt: skip
    model = helper.make_model(graph)
    convert_model_to_external_data(model, all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    onnx.save(model, tmp_path / "m.onnx")
    found = {(ref.tensor, ref.location) for ref in external_data(tmp_path / "m.onnx")}
    assert {name for name, _ in found} == {"branch_w", "cv"}
    assert all(location for _, location in found)


@pytest.mark.parametrize("data", [b"\xff" * 20, b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0b\x00"])
def test_a_file_that_is_not_onnx_is_a_clear_refusal(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "m.onnx").write_bytes(data)
    with pytest.raises(BundleError, match="not a well-formed ONNX model"):
        external_data(tmp_path / "m.onnx")
