"""Small models that arrive quantized, one per kind, made here with ONNX Runtime's own quantizers (what exporters
and users run before handing a model over): QDQ, QOperator, integer ops (dynamic), weight-only (DequantizeLinear
weights, MatMulNBits) and a com.microsoft contrib operator (DynamicQuantizeLSTM)."""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(11)
SAMPLES = 32


def conv_matmul() -> onnx.ModelProto:
    """x [N, 3, 8, 8] → Conv 3→8 → Relu → flatten → MatMul 512 → 64 → Relu → MatMul 64 → 10: float."""
    inits = [
        numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(RNG.standard_normal((512, 64)).astype(np.float32) * 0.05, "m1"),
        numpy_helper.from_array(RNG.standard_normal((64, 10)).astype(np.float32) * 0.2, "m2"),
        numpy_helper.from_array(np.array([-1, 512], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "m1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu1"),
        helper.make_node("MatMul", ["hr", "m2"], ["logits"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "conv-matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def lstm() -> onnx.ModelProto:
    """x [T, 1, 16] → LSTM 16 → 32 → Squeeze → MatMul 32 → 8: float."""
    hidden = 32
    inits = [
        numpy_helper.from_array(RNG.standard_normal((1, 4 * hidden, 16)).astype(np.float32) * 0.2, "W"),
        numpy_helper.from_array(RNG.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.2, "R"),
        numpy_helper.from_array(RNG.standard_normal((hidden, 8)).astype(np.float32) * 0.2, "out_w"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["y", "axis"], ["ys"], name="squeeze"),
        helper.make_node("MatMul", ["ys", "out_w"], ["out"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, 1, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [20, 1, 8])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def data(model: onnx.ModelProto, count: int = SAMPLES) -> dict[str, np.ndarray]:
    """Inputs for `model`, axis 0 = sample, each sample in the model's own shape."""
    spec = model.graph.input[0]
    dims = [d.dim_value or 1 for d in spec.type.tensor_type.shape.dim]
    return {spec.name: RNG.standard_normal((count, *dims)).astype(np.float32)}


class _Reader:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._rows = [{k: v[i] for k, v in arrays.items()} for i in range(len(next(iter(arrays.values()))))]
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._rows)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._rows)


def _via_files(model: onnx.ModelProto, quantize) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))
        quantize(str(src), str(out))
        return onnx.load(str(out))


def qdq() -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, quantize_static

    model = conv_matmul()
    return _via_files(model, lambda s, o: quantize_static(s, o, _Reader(data(model)), quant_format=QuantFormat.QDQ,
                                                          per_channel=True))  # fmt: skip


def qoperator() -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, quantize_static

    model = conv_matmul()
    return _via_files(model, lambda s, o: quantize_static(s, o, _Reader(data(model)),
                                                          quant_format=QuantFormat.QOperator))  # fmt: skip


def integer_ops() -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    return _via_files(conv_matmul(), lambda s, o: quantize_dynamic(s, o, op_types_to_quantize=["MatMul", "Conv"]))


def weight_only() -> onnx.ModelProto:
    """Every weight stored int8 per output channel and dequantized by DequantizeLinear; activations float."""
    model = conv_matmul()
    replaced = []
    for init in list(model.graph.initializer):
        if init.name not in ("w", "m1", "m2"):
            continue
        values = numpy_helper.to_array(init)
        axis = 0 if init.name == "w" else 1
        scale = np.abs(values).max(axis=tuple(i for i in range(values.ndim) if i != axis)) / 127.0
        shape = [1] * values.ndim
        shape[axis] = -1
        q = np.clip(np.rint(values / scale.reshape(shape)), -127, 127).astype(np.int8)
        replaced.append(init.name)
        model.graph.initializer.remove(init)
        model.graph.initializer.extend([
            numpy_helper.from_array(q, f"{init.name}_q"),
            numpy_helper.from_array(scale.astype(np.float32), f"{init.name}_s"),
            numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{init.name}_z"),
        ])  # fmt: skip
        model.graph.node.insert(0, helper.make_node("DequantizeLinear", [f"{init.name}_q", f"{init.name}_s",
                                                    f"{init.name}_z"], [init.name], axis=axis))  # fmt: skip
    return model


def matmul_nbits() -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(conv_matmul(), block_size=32, is_symmetric=True)
    quantizer.process()
    return quantizer.model.model


def contrib_lstm() -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    return _via_files(lstm(), lambda s, o: quantize_dynamic(s, o, op_types_to_quantize=["LSTM", "MatMul"]))


KINDS = {
    "qdq": (qdq, conv_matmul), "qoperator": (qoperator, conv_matmul), "integer-ops": (integer_ops, conv_matmul),
    "weight-only": (weight_only, conv_matmul), "matmul-nbits": (matmul_nbits, conv_matmul),
    "contrib": (contrib_lstm, lstm),
}  # fmt: skip
