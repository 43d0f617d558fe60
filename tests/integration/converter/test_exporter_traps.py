"""What exporters write that a converter meets in the wild: declared shapes that disagree with what the model
returns, weights listed as graph inputs, placeholder input shapes, outputs that pass an input through, NHWC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from edgefleet.converter import ConvertRequest, convert, load_model
from edgefleet.converter.onnx_graph import image_layout
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.errors import DataError
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.models import quantized as qm


def _convert(tmp_path: Path, key: SigningKey, model: onnx.ModelProto, **extra: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    data = qm.data(qm.conv_matmul(), 24)
    np.savez(tmp_path / "calib.npz", **data)
    np.savez(tmp_path / "eval.npz", **data)
    (result,) = convert(
        ConvertRequest(
            model=path, profiles=[get_profile("generic-x86-64")], calib=tmp_path / "calib.npz",
            eval=tmp_path / "eval.npz", out=tmp_path / "out", key=key, name="trap", version="1", report=False,
            **extra,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    return result


def _manifest(result) -> object:  # type: ignore[no-untyped-def]
    assert result.bundle, result.error
    return parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)


def test_a_declared_output_shape_that_disagrees_with_a_real_run_is_corrected_in_the_signature_with_a_warning(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    model = qm.conv_matmul()
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value = 5  # the model returns 10 logits
    result = _convert(tmp_path, signing_key, model)
    warning = next(n for n in result.notes if "is declared" in n)
    assert "'logits' is declared float32 ['N', 5], but the model returns float32 [1, 10]" in warning
    assert _manifest(result).outputs[0].shape == ["N", 10]  # type: ignore[attr-defined]


def test_weights_listed_as_inputs_become_initializers(tmp_path: Path, signing_key: SigningKey) -> None:
    model = qm.conv_matmul()
    for init in model.graph.initializer:  # how IR 3 exporters list every weight
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    path = tmp_path / "weights-as-inputs.onnx"
    onnx.save(model, str(path))
    source = load_model(path)
    assert [i.name for i in source.proto.graph.input] == ["x"]
    assert any(p.name == "weights-as-inputs" and p.params["initializers"] == 5 for p in source.passes)
    manifest = _manifest(_convert(tmp_path, signing_key, model))
    assert [i.name for i in manifest.inputs] == ["x"]  # type: ignore[attr-defined]


def test_a_placeholder_input_shape_gets_an_input_shape_hint_and_the_hint_works(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    model = qm.conv_matmul()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_value, dims[2].dim_value, dims[3].dim_value = 1, 1, 1  # a [1, 3, 1, 1] placeholder
    with pytest.raises(DataError, match=r"give the data's real one: --input-shape x=1,3,8,8"):
        _convert(tmp_path, signing_key, model)
    manifest = _manifest(_convert(tmp_path, signing_key, model, input_shapes={"x": [1, 3, 8, 8]}))
    assert manifest.inputs[0].shape == [1, 3, 8, 8]  # type: ignore[attr-defined]


def test_an_output_that_passes_an_input_through_is_kept_and_never_judged(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    model = qm.conv_matmul()
    model.graph.node.append(helper.make_node("Identity", ["x"], ["echo"], name="echo"))
    model.graph.output.insert(0, helper.make_tensor_value_info("echo", onnx.TensorProto.FLOAT, ["N", 3, 8, 8]))
    result = _convert(tmp_path, signing_key, model)
    manifest = _manifest(result)
    assert [o.name for o in manifest.outputs] == ["echo", "logits"]  # type: ignore[attr-defined]
    assert [c.output for c in manifest.golden.outputs] == ["logits"]  # type: ignore[attr-defined]
    assert result.metric == "argmax-agreement"  # the logits are judged, not the echo that comes first


def test_inspect_names_an_nhwc_input(tmp_path: Path) -> None:
    from edgefleet.converter import inspect_model

    model = qm.conv_matmul()
    transpose = helper.make_node("Transpose", ["image"], ["x"], perm=[0, 3, 1, 2], name="to_nchw")
    model.graph.node.insert(0, transpose)
    del model.graph.input[:]
    model.graph.input.append(helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["N", 8, 8, 3]))
    onnx.save(model, str(tmp_path / "nhwc.onnx"))
    assert inspect_model(tmp_path / "nhwc.onnx", []).layouts == {"image": "NHWC"}


def test_image_layouts_are_recognized() -> None:
    assert image_layout([1, 320, 320, 3]) == "NHWC" and image_layout(["N", 224, 224, 3]) == "NHWC"
    assert image_layout([1, 3, 320, 320]) == "NCHW" and image_layout(["N", 1, "h", "w"]) == "NCHW"
    assert image_layout([1, 16, 16, 16]) is None and image_layout([1, 3, 8]) is None
