"""Graph and precision passes: each runs on a tiny model in tmp_path, never mutates its input, and is judged
by the graph it returns."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter import load_model
from edgefleet.converter.onnx_graph import count_ops, op_inventory
from edgefleet.converter.passes import PASSES, graph, passes_for, precision
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.search.gate import Budget, gate, plan_metric, score
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

from support.paths import DIGITS

RNG = np.random.default_rng(0)


def _conv_bn_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.normal(size=(4, 1, 3, 3)).astype(np.float32), "W")
    values = {"g": RNG.uniform(0.5, 2, 4), "b": RNG.normal(size=4), "m": RNG.normal(size=4)}
    values["v"] = RNG.uniform(0.5, 2, 4)
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in values.items()]
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Identity", ["x"], ["x1"]),
        helper.make_node("Conv", ["x1", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["t2"], ["t3"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["t3", "shape"], ["y"]),
    ]
    graph_ = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 144])], [w, *bn, shape],
    )  # fmt: skip
    return helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


X = RNG.normal(size=(1, 1, 6, 6)).astype(np.float32)


def test_the_registry_lists_every_pass_with_its_needs() -> None:
    names = {"fold-constants", "fuse-conv-bn", "remove-redundant", "fix-dims", "pin-inputs", "convert-opset"}
    assert names | {"shape-inference", "fp16", "int8-dynamic", "int8-static-qdq", "openvino-ir", "nncf-int8"} <= set(
        PASSES
    )
    assert PASSES["nncf-int8"].needs == ("nncf", "openvino") and PASSES["int8-static-qdq"].needs_calibration
    assert {p.name for p in passes_for("openvino", "int8-static")} >= {"nncf-int8", "fold-constants"}
    assert "int8-static-qdq" not in {p.name for p in passes_for("openvino", "int8-static")}


def test_conv_bn_fusion_removes_the_batchnorm_and_keeps_outputs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _conv_bn_model()
    before = model.SerializeToString()
    fused = graph.fuse_conv_bn(model)
    assert model.SerializeToString() == before  # pure: the input is untouched
    assert "BatchNormalization" not in count_ops(fused) and count_ops(fused)["Relu"] == 1
    onnx.save(fused, str(tmp_path / "fused.onnx"))
    np.testing.assert_allclose(_run(fused, X), _run(model, X), rtol=1e-5, atol=1e-5)


def test_redundant_identity_cast_transpose_pairs_are_removed() -> None:
    model = _conv_bn_model()
    cleaned = graph.remove_redundant(model)
    ops = count_ops(cleaned)
    assert "Identity" not in ops and "Cast" not in ops and "Transpose" not in ops
    assert ops["Reshape"] == 1  # the last node feeds the graph output, so it stays
    np.testing.assert_allclose(_run(cleaned, X), _run(model, X), rtol=1e-6)


def test_constant_folding_stays_portable() -> None:
    folded = graph.fold_constants(load_model(DIGITS / "digits_cnn.onnx").proto)
    assert {n.domain for n in folded.graph.node} <= {"", "ai.onnx"}


def test_fix_dims_and_pin_inputs() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x, k], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    fixed = graph.fix_dims(model, graph.FixDimsConfig(dims={"batch": 1}, shapes={"x": [1, 3]}))
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [1, 3]
    pinned = graph.pin_inputs(model, graph.PinConfig({"k": np.array(2.0, np.float32)}))
    assert [i.name for i in pinned.graph.input] == ["x"] and len(model.graph.input) == 2
    out = _run(pinned, np.ones((2, 3), np.float32))
    assert np.all(out == 2.0)
    with pytest.raises(Exception, match="the model's inputs are"):
        graph.pin_inputs(model, graph.PinConfig({"nope": np.array(1.0)}))


def test_opset_conversion_and_an_unreachable_opset() -> None:
    model = load_model(DIGITS / "digits_cnn.onnx").proto
    assert graph.default_opset(graph.convert_opset(model, graph.OpsetConfig(18))) == 18
    with pytest.raises(ConversionError, match=r"cannot convert opset 17 to 13: .*BatchNormalization"):
        graph.convert_opset(model, graph.OpsetConfig(13))


def test_shape_inference_fills_value_info() -> None:
    inferred = graph.infer_shapes(_conv_bn_model())
    assert {"c", "n", "r"} <= {v.name for v in inferred.graph.value_info}


def _digits() -> tuple[onnx.ModelProto, Dataset]:
    calib = np.load(DIGITS / "calib.npz")
    return load_model(DIGITS / "digits_cnn.onnx").proto, Dataset({"input": calib["input"][:32]}, None)


def test_fp16_keeps_float32_io() -> None:
    model, _ = _digits()
    half = precision.to_fp16(model)
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(i.data_type == TensorProto.FLOAT16 for i in half.graph.initializer)


def test_int8_dynamic_refuses_conv_graphs_and_quantizes_matmul_only() -> None:
    model, _ = _digits()
    assert "not suited" in (precision.dynamic_unsuitability(model) or "")
    quantized = precision.quantize_int8_dynamic(model)
    assert "ConvInteger" not in count_ops(quantized)


@pytest.mark.parametrize(("activations", "reduce_range"), [("uint8", False), ("uint8", True), ("int8", False)])
def test_int8_static_qdq_per_channel_with_exclusions(activations: str, reduce_range: bool) -> None:
    model, calib = _digits()
    config = precision.StaticConfig(activations=activations, reduce_range=reduce_range)  # type: ignore[arg-type]
    qdq = precision.quantize_int8_static(model, config, calib)
    ops = count_ops(qdq)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > ops["QuantizeLinear"]  # weights per channel
    zero_points = [i for i in qdq.graph.initializer if i.name.endswith("_zero_point")]
    wanted = TensorProto.UINT8 if activations == "uint8" else TensorProto.INT8
    assert any(z.data_type == wanted for z in zero_points)
    gemm = next(n.name for n in model.graph.node if n.op_type == "Gemm")
    excluded = precision.quantize_int8_static(model, precision.StaticConfig(exclude_nodes=(gemm,)), calib)
    gemm_inputs = next(n.input for n in excluded.graph.node if n.op_type == "Gemm")
    assert not any(name.endswith("_DequantizeLinear_Output") for name in gemm_inputs[1:])


def test_layer_report_names_layers_with_their_sqnr() -> None:
    model, calib = _digits()
    qdq = precision.quantize_int8_static(model, precision.StaticConfig(), calib)
    report = precision.layer_report(model, qdq, calib, samples=8)
    assert report.layers and all(np.isfinite(layer.sqnr_db) for layer in report.layers)
    assert report.worst(1)[0].sqnr_db == min(layer.sqnr_db for layer in report.layers)


def test_openvino_export_records_the_hint_and_nncf_quantizes() -> None:
    model, calib = _digits()
    artifact = ovp.export_openvino(model, ovp.OpenVINOConfig("f32"))
    assert artifact.inference_precision_hint == "f32"
    quantized = ovp.quantize_nncf(artifact, ovp.NNCFConfig(subset_size=16), calib)
    assert any(op.get_type_name() == "FakeQuantize" for op in quantized.model.get_ops())
    assert not any(op.get_type_name() == "FakeQuantize" for op in artifact.model.get_ops())


def test_metric_plans_and_the_gate() -> None:
    scores = {"logits": RNG.normal(size=(10, 1, 10)).astype(np.float32)}
    assert plan_metric(scores, np.zeros(10, np.int64)).name == "top1"
    assert plan_metric(scores, None).name == "argmax-agreement"
    assert plan_metric({"label": np.zeros((10, 1), np.int64)}, None).kind == "label"
    signal = {"prob": RNG.uniform(size=(10, 1, 1)).astype(np.float32)}
    plan = plan_metric(signal, np.zeros(10, np.int64))  # one probability per sample: its decision and its value
    assert plan.name == "mask-iou-mae@0.5" and "labels ignored" in plan.note and plan.default_drop == 0.05
    assert "one probability per sample" in plan.description  # why, as the manifest records it
    plan = plan_metric(signal, np.zeros(10, np.int64), sqnr=True)  # --min-sqnr and no --metric: judged by SQNR
    noisy = {"prob": signal["prob"] + 0.1}
    result = score(noisy, signal, None, plan)
    assert result.metric == "sqnr-db" and result.max_abs == pytest.approx(0.1, abs=1e-6)
    assert "below the budget floor 60.0 dB" in (gate(result, 120.0, Budget(0.01, 60.0)) or "")
    assert gate(score(signal, signal, None, plan), 120.0, Budget(0.01, 60.0)) is None


def test_op_inventory_counts_subgraph_ops() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch")
    model = helper.make_model(
        helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
        opset_imports=[helper.make_opsetid("", 16)],
    )  # fmt: skip
    uses = {u.op_type: u for u in op_inventory(model)}
    assert uses["Relu"].in_subgraphs == 1 and uses["Relu"].subgraphs == ["branch/then_branch"]
    assert uses["If"].in_subgraphs == 0 and uses["Neg"].opset == 16
