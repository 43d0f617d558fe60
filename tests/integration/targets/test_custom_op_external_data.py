"""A custom-op bundle whose weights live in an external data file: the agent loads a copy of the model with the
custom-op domain renamed for onnxruntime-extensions, and the external data must travel with that copy.

The model (MatMul with external weights, then the worked example's `edgefleet.ops::Swish`) is converted on the
converter's >2 GiB path (the limit lowered to 4 KiB, as in test_converter_exports.py), which keeps the weights in
their own file in the bundle; a real agent with the custom-op package serves it, and its answers equal the same
model run on the host through the same package."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.agent.runtime import custom_ops as agent_ops
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import normalize
from edgefleet.converter.runners import ort_runner
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.custom_ops.packages import CustomOpPackageError
from edgefleet.core.custom_ops.renamed_copy import renamed_copy
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.paths import DIGITS

PACKAGE = DIGITS.parent / "custom_op" / "swish_op.py"
WEIGHTS = "weights.bin"


def swish_mlp(path: Path) -> Path:
    """y = Swish(x @ W, beta=1.5) with W (64x32 floats, 8 KiB) in `weights.bin` beside the model."""
    weights = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Swish", ["h"], ["y"], domain="edgefleet.ops", beta=1.5),
    ]
    graph = helper.make_graph(
        nodes, "swish_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [numpy_helper.from_array(weights, "W")],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgefleet.ops", 1)]
    )
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=WEIGHTS,
              size_threshold=0)  # fmt: skip
    return path


def test_an_external_data_model_with_a_custom_op_runs_on_an_agent_with_its_weights(
    tmp_path: Path, signing_key: SigningKey, start_agent: Callable[..., AgentProcess], host: Connection,
    topics: Topics, watcher: FleetWatcher, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    model = swish_mlp(tmp_path / "src" / "swish_mlp.onnx")
    x = np.random.default_rng(1).standard_normal((16, 1, 64)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    np.savez(tmp_path / "eval.npz", x=x)
    monkeypatch.setenv(cops.ENV_VAR, str(PACKAGE))
    monkeypatch.setattr(normalize, "PROTOBUF_LIMIT", 4096)  # the >2 GiB path, on 8 KiB of weights
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("generic-x86-64")], calib=tmp_path / "calib.npz",
            eval=tmp_path / "eval.npz", out=tmp_path / "out", key=signing_key, name="swish-mlp", version="1",
            report=False, custom_ops="host",
        )
    )  # fmt: skip
    assert result.bundle, result.error
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert [op.key for op in manifest.custom_ops] == ["edgefleet.ops::Swish"]
    files = {f.path for f in manifest.files}
    assert manifest.format == "onnx" and f"model/{WEIGHTS}" in files, files  # the weights stay external

    start_agent("dev-swish-ext", profile="generic-x86-64", env={agent_ops.ENV_VAR: str(PACKAGE)})
    bundle_id = deploy_to(host, topics, Path(result.bundle), devices=("dev-swish-ext",))
    watcher.serving("dev-swish-ext", bundle_id, timeout=90)
    answers = RemoteModel(host, topics, "dev-swish-ext").infer_many([{"x": sample} for sample in x[:8]])
    assert all(a.ok and a.bundle_id == bundle_id for a in answers), [a.error for a in answers if not a.ok]
    got = np.concatenate([a.outputs["y"].to_array() for a in answers])
    host_side = ort_runner(model)  # the same op on the host, through the same package, weights read from the file
    expected = np.concatenate([host_side({"x": sample})["y"] for sample in x[:8]])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(expected).max() > 1.0  # the weights were read: zeros would give Swish(0) = 0 everywhere
    # The renamed copy the agent loaded kept its weights external: a small graph with weights.bin beside it.
    copies = sorted(tmp_path.rglob(f"custom-ops/*/{WEIGHTS}"))
    assert copies, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("custom-ops/**/*"))
    for weights in copies:
        (graph,) = weights.parent.glob("*.onnx")
        assert graph.stat().st_size < 4096 and weights.stat().st_size == 64 * 32 * 4


def test_a_model_over_2_gib_is_renamed_without_reading_its_weights(tmp_path: Path) -> None:
    """2.2 GiB of external weights (a sparse file: no disk used): the renamed copy links them, never loads them;
    loading them into one protobuf would need 2.2 GiB of memory and then fail at protobuf's 2 GiB limit."""
    path = swish_mlp(tmp_path / "big" / "model.onnx")
    proto = onnx.load(str(path), load_external_data=False)
    size = int(2.2 * 2**30)
    weights = proto.graph.initializer[0]
    del weights.dims[:]
    weights.dims.extend([size // 4 // 32, 32])
    for entry in weights.external_data:
        if entry.key == "length":
            entry.value = str(size)
    onnx.save(proto, str(path))
    with open(path.parent / WEIGHTS, "wb") as handle:
        handle.truncate(size)
    copy = renamed_copy(onnx, path, ["edgefleet.ops::Swish"], tmp_path / "work")
    renamed = onnx.load(str(copy), load_external_data=False)
    assert [(n.domain, n.op_type) for n in renamed.graph.node][1] == ("ai.onnx.contrib", "edgefleet_ops__Swish")
    assert "edgefleet.ops" not in {i.domain for i in renamed.opset_import}
    assert copy.stat().st_size < 4096  # the graph alone
    beside = copy.parent / WEIGHTS
    assert beside.stat().st_size == size
    source = (path.parent / WEIGHTS).stat()
    if beside.stat().st_ino != source.st_ino:  # not linked (another file system): a full copy, never a partial one
        assert beside.stat().st_size == source.st_size
    assert renamed_copy(onnx, path, ["edgefleet.ops::Swish"], tmp_path / "work") == copy  # made once


def test_an_external_data_location_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    path = swish_mlp(tmp_path / "m" / "model.onnx")
    proto = onnx.load(str(path), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../elsewhere.bin"
    onnx.save(proto, str(path))
    with pytest.raises(CustomOpPackageError, match=r"'\.\./elsewhere\.bin' is not a file inside the model's folder"):
        renamed_copy(onnx, path, ["edgefleet.ops::Swish"], tmp_path / "work")
