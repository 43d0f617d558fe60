"""The work one inference does, read from an ONNX graph: multiply-accumulates by operator and precision, the other
arithmetic, and the bytes of weights and activations it moves.

Shapes come from ONNX shape inference with the inputs fixed to a real sample's shapes; where inference leaves a
compute node's shapes unknown, one run of the model with those tensors as extra outputs supplies them.

- MACs: Conv (and ConvInteger, QLinearConv, NhwcConv, FusedConv) = output elements × weight elements per output
  channel; ConvTranspose = input elements × the same; MatMul-like (MatMul, MatMulInteger, QLinearMatMul,
  FusedMatMul, MatMulNBits, Gemm) = output elements × K; LSTM / GRU / RNN = steps × batch × directions × gates ×
  hidden × (input + hidden); Attention / MultiHeadAttention (com.microsoft) = their projections and the two
  attention products.
- Precision of a MAC: int8 where the node computes in integers (ConvInteger, MatMulInteger, QLinear*, dynamic
  quantized contrib ops) or where both its data and weight inputs come from DequantizeLinear (a QDQ graph, which
  ONNX Runtime runs as fused int8 kernels); fp16 where its output is float16; else fp32. MatMulNBits
  (weight-only) computes in float.
- Other arithmetic: one operation per output element of every other node (element-wise ops, reductions,
  normalizations); Q/DQ, shape and layout plumbing count nothing.
- Bytes moved: every weight once, plus each node's activation inputs read and outputs written once, at the
  size the executing kernel sees (a DequantizeLinear output is read as its int8 input, an output that only feeds
  QuantizeLinear is written as int8). A lower bound on traffic: a kernel that re-reads a tile moves more; a
  tensor that stays in cache moves less to memory.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgefleet.converter.onnx_graph import graph_nodes

__all__ = ["Work", "onnx_work", "openvino_work"]

CONV = {"Conv", "ConvInteger", "QLinearConv", "NhwcConv", "FusedConv"}
MATMUL = {"MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits", "Gemm", "FusedGemm",
          "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}  # fmt: skip
RNN = {"LSTM": 4, "GRU": 3, "RNN": 1, "DynamicQuantizeLSTM": 4}
ATTENTION = {"Attention", "MultiHeadAttention", "QAttention"}
INTEGER = {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat",
           "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention"}  # fmt: skip
PLUMBING = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Reshape", "Transpose", "Squeeze",
            "Unsqueeze", "Flatten", "Shape", "Gather", "Slice", "Concat", "Split", "Identity", "Cast", "Constant",
            "ConstantOfShape", "Expand", "Pad", "Tile", "Size", "Range"}  # fmt: skip
WEIGHT_INPUT = {"QLinearConv": 3, "QLinearMatMul": 3}  # the weight's input index where it is not 1


@dataclass
class Work:
    """What one inference of a graph does."""

    macs: dict[str, int] = field(default_factory=dict)  # by operator type
    macs_by_precision: dict[str, int] = field(default_factory=dict)  # int8 / fp16 / fp32
    other_ops: int = 0  # element-wise and other arithmetic, one per output element
    weight_bytes: int = 0
    activation_bytes: int = 0  # activations read and written, inputs and outputs included
    unknown: list[str] = field(default_factory=list)  # compute nodes whose work could not be counted

    @property
    def total_macs(self) -> int:
        return sum(self.macs.values())

    @property
    def flops(self) -> int:
        return 2 * self.total_macs + self.other_ops

    @property
    def bytes_moved(self) -> int:
        return self.weight_bytes + self.activation_bytes

    def as_dict(self) -> dict[str, object]:
        return {
            "macs": self.total_macs,
            "flops": self.flops,
            "macs_by_op": dict(sorted(self.macs.items(), key=lambda kv: -kv[1])),
            "macs_by_precision": self.macs_by_precision,
            "other_ops": self.other_ops,
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "bytes_moved": self.bytes_moved,
            "not_counted": self.unknown[:20],
        }


def onnx_work(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Work:
    """The work of one inference of `model` on inputs shaped like `feeds` (one sample, batch included)."""
    shapes, types = _shapes(model, feeds)
    inits = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:  # Constant nodes are weights too
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            inits[node.output[0]] = node.attribute[0].t
    for name, init in inits.items():
        shapes.setdefault(name, list(init.dims))
        types.setdefault(name, init.data_type)
    producers = {out: node for node in model.graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    work = Work(weight_bytes=sum(_tensor_bytes(init) for init in inits.values()))

    def elements(name: str) -> int | None:
        shape = shapes.get(name)
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            return None
        return math.prod(shape)

    def element_size(name: str) -> int:
        producer = producers.get(name)
        if producer is not None and producer.op_type == "DequantizeLinear":
            return _size(types.get(producer.input[0], TensorProto.INT8))  # fused: the kernel reads the int8 tensor
        users = consumers.get(name, [])
        if users and all(u.op_type == "QuantizeLinear" for u in users):
            return 1  # fused: the kernel writes int8
        return _size(types.get(name, TensorProto.FLOAT))

    def dequantized(name: str) -> bool:
        producer = producers.get(name)
        return producer is not None and producer.op_type in ("DequantizeLinear", "DynamicQuantizeLinear")

    for node in model.graph.node:
        if node.op_type in ("Constant", "QuantizeLinear", "DequantizeLinear"):
            continue
        for name in node.input:
            if name and name not in inits:
                count = elements(name)
                work.activation_bytes += (count or 0) * element_size(name)
        for name in node.output:
            if name and (count := elements(name)) is not None:
                work.activation_bytes += count * element_size(name)
        macs = _macs(node, shapes, elements)
        if macs is None:
            work.unknown.append(f"{node.op_type} {node.name or node.output[0]}")
            continue
        if macs:
            work.macs[node.op_type] = work.macs.get(node.op_type, 0) + macs
            weight = node.input[WEIGHT_INPUT.get(node.op_type, 1)] if len(node.input) > 1 else ""
            if node.op_type in INTEGER or (dequantized(node.input[0]) and dequantized(weight)):
                precision = "int8"
            elif types.get(node.output[0]) == TensorProto.FLOAT16:
                precision = "fp16"
            elif types.get(node.output[0]) == TensorProto.BFLOAT16:
                precision = "bf16"
            else:
                precision = "fp32"
            work.macs_by_precision[precision] = work.macs_by_precision.get(precision, 0) + macs
        elif node.op_type not in PLUMBING:
            work.other_ops += elements(node.output[0]) or 0
    inner = len(graph_nodes(model.graph)) - len(model.graph.node)
    if inner:
        work.unknown.append(f"{inner} nodes inside If/Loop/Scan bodies")
    return work


def _macs(node: onnx.NodeProto, shapes: dict[str, list[int]], elements) -> int | None:  # type: ignore[no-untyped-def]
    """The node's multiply-accumulates (0: not a compute node; None: its shapes are unknown)."""
    op = node.op_type

    def shape(index: int) -> list[int] | None:
        if index >= len(node.input) or not node.input[index]:
            return None
        found = shapes.get(node.input[index])
        return found if found is not None and all(isinstance(d, int) and d >= 0 for d in found) else None

    out = elements(node.output[0]) if node.output else None
    if op in CONV:
        weight = shape(WEIGHT_INPUT.get(op, 1))
        return None if weight is None or out is None else out * math.prod(weight[1:])
    if op == "ConvTranspose":
        data, weight = shape(0), shape(1)
        return None if data is None or weight is None else math.prod(data) * math.prod(weight[1:])
    if op in MATMUL:
        if op == "MatMulNBits":
            k = next((a.i for a in node.attribute if a.name == "K"), 0)
            return None if out is None or not k else out * k
        data = shape(0)
        if data is None or out is None:
            return None
        if op in ("Gemm", "FusedGemm"):
            trans = next((a.i for a in node.attribute if a.name == "transA"), 0)
            return out * (data[0] if trans else data[-1])
        return out * data[-1]
    if op in RNN:
        data, weight = shape(0), shape(1)  # X [seq, batch, input], W [dirs, gates*hidden, input]
        if data is None or weight is None:
            return None
        hidden = weight[1] // RNN[op]
        return data[0] * data[1] * weight[0] * weight[1] * (data[2] + hidden)
    if op in ATTENTION:
        data = shape(0)
        if data is None or len(data) != 3:
            return None
        batch, seq, width = data
        if op == "MultiHeadAttention":
            keys = shape(1)
            length = keys[1] if keys is not None and len(keys) == 3 else seq
            return 2 * batch * seq * length * width
        weight = shape(1)
        hidden = weight[1] // 3 if weight is not None else width
        return batch * seq * width * 3 * hidden + 2 * batch * seq * seq * hidden
    return 0


def _shapes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Every tensor's shape and element type with the inputs fixed to `feeds`' shapes."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in feeds:
            dims = value.type.tensor_type.shape.dim
            shape = np.asarray(feeds[value.name]).shape
            if len(dims) == len(shape):
                for dim, size in zip(dims, shape, strict=True):
                    dim.Clear()
                    dim.dim_value = int(size)
    with contextlib.suppress(Exception):  # inference refuses some graphs (contrib ops, old IRs): a run fills in
        fixed = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    shapes: dict[str, list[int]] = {}
    types: dict[str, int] = {}
    for value in [*fixed.graph.input, *fixed.graph.value_info, *fixed.graph.output]:
        tensor = value.type.tensor_type
        types[value.name] = tensor.elem_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = [int(d.dim_value) for d in tensor.shape.dim]
    missing = [
        name
        for node in fixed.graph.node
        if node.op_type in CONV | MATMUL | ATTENTION | set(RNN) | {"ConvTranspose"}
        for name in [*node.input[:2], node.output[0]]
        if name and name not in shapes and name not in {i.name for i in fixed.graph.initializer}
    ]
    if missing:
        shapes.update(_run_shapes(model, feeds, missing, types))
    return shapes, types


def _run_shapes(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: list[str], types: dict[str, int]
) -> dict[str, list[int]]:
    """The shapes of `names` from one run of the model with them as extra outputs (empty where it cannot run)."""
    import onnxruntime as ort

    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    present = {o.name for o in extended.graph.output}
    for name in dict.fromkeys(names):
        if name not in present:
            extended.graph.output.append(helper.make_empty_tensor_value_info(name))
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(extended.SerializeToString(), options, providers=["CPUExecutionProvider"])
        wanted = [o.name for o in session.get_outputs() if o.name in set(names)]
        values = session.run(wanted, {k: np.asarray(v) for k, v in feeds.items()})
    except Exception:  # a graph ORT cannot run unoptimized (custom ops): those nodes stay uncounted
        return {}
    found = {}
    for name, value in zip(wanted, values, strict=True):
        found[name] = list(np.asarray(value).shape)
        if name not in types or types[name] == TensorProto.UNDEFINED:
            types[name] = helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)
    return found


def _size(elem_type: int) -> int:
    if elem_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        return 4
    try:
        return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, TypeError, ValueError):
        return 1  # int4 / uint4 and other packed types: about a byte


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    count = math.prod(tensor.dims)
    if tensor.data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (count + 1) // 2
    if tensor.raw_data:
        return len(tensor.raw_data)
    return count * _size(tensor.data_type)


OV_VIEWS = {"Reshape", "Squeeze", "Unsqueeze", "ShapeOf", "FakeQuantize"}  # no activation traffic of their own
OV_CONV = {"Convolution": 1, "GroupConvolution": 2}  # weight dims before the per-output-channel window
OV_PLUMBING = {
    "Constant",
    "Parameter",
    "Result",
    "Convert",
    "FakeQuantize",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "ShapeOf",
    "Gather",
    "StridedSlice",
    "Concat",
    "Split",
    "VariadicSplit",
    "Broadcast",
    "Subtract",
    "Multiply",
}  # fmt: skip  (Subtract/Multiply after a Convert are weight decompression)


def openvino_work(model: object, feeds: Mapping[str, np.ndarray], hint: str | None) -> Work:
    """The work of one inference of an OpenVINO model (ov.Model, e.g. read from a bundle's IR) on inputs shaped
    like `feeds`: a MAC is int8 where its data input comes from a FakeQuantize (NNCF's INT8), else at the
    inference precision hint (bf16 / f16) or fp32."""
    import openvino as ov

    assert isinstance(model, ov.Model)
    model = model.clone()
    assert isinstance(model, ov.Model)
    shapes = {}
    for port in model.inputs:
        name = next((n for n in port.get_names() if n in feeds), None)
        if name is not None:
            shapes[port] = ov.PartialShape(list(np.asarray(feeds[name]).shape))
    if shapes:
        model.reshape(shapes)
    float_precision = {"bf16": "bf16", "f16": "fp16"}.get(hint or "", "fp32")
    work = Work()

    def static(shape: object) -> list[int] | None:
        return [int(d) for d in shape.to_shape()] if shape.is_static else None  # type: ignore[attr-defined]

    weight_side: set[str] = set()  # ops computed from constants alone (a weight's FakeQuantize, decompression)
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        if kind == "Constant":
            work.weight_bytes += int(op.get_byte_size()) if hasattr(op, "get_byte_size") else 0
            weight_side.add(op.get_friendly_name())
            continue
        if kind in ("Parameter", "Result"):
            continue
        outputs = [static(op.get_output_partial_shape(i)) for i in range(op.get_output_size())]
        out = math.prod(outputs[0]) if outputs and outputs[0] is not None else None
        sources = [op.input(i).get_source_output().get_node() for i in range(op.get_input_size())]
        if sources and all(s.get_friendly_name() in weight_side for s in sources):
            weight_side.add(op.get_friendly_name())  # folded or fused when compiled: its bytes are the weight's
            continue
        if kind not in OV_VIEWS:  # a view moves no bytes; a FakeQuantize's input is read by its consumer's kernel
            for i, source in enumerate(sources):
                if source.get_friendly_name() not in weight_side:
                    shape = static(op.get_input_partial_shape(i))
                    size = 1 if source.get_type_name() == "FakeQuantize" else op.get_input_element_type(i).size
                    work.activation_bytes += math.prod(shape) * size if shape is not None else 0
            for i, shape in enumerate(outputs):
                if shape is not None and kind != "FakeQuantize":
                    work.activation_bytes += math.prod(shape) * op.get_output_element_type(i).size
        macs: int | None = 0
        if kind in OV_CONV:
            weight = static(op.get_input_partial_shape(1))
            macs = None if weight is None or out is None else out * math.prod(weight[OV_CONV[kind] :])
        elif kind == "ConvolutionBackpropData":
            data, weight = static(op.get_input_partial_shape(0)), static(op.get_input_partial_shape(1))
            macs = None if data is None or weight is None else math.prod(data) * math.prod(weight[1:])
        elif kind == "MatMul":
            data = static(op.get_input_partial_shape(0))
            transposed = bool(op.get_attributes().get("transpose_a", False))
            if data is None or out is None:
                macs = None
            else:
                macs = out * (data[-2] if transposed and len(data) > 1 else data[-1])
        if macs is None:
            work.unknown.append(f"{kind} {op.get_friendly_name()}")
            continue
        if macs:
            work.macs[kind] = work.macs.get(kind, 0) + macs
            precision = "int8" if sources and sources[0].get_type_name() == "FakeQuantize" else float_precision
            work.macs_by_precision[precision] = work.macs_by_precision.get(precision, 0) + macs
        elif kind not in OV_PLUMBING:
            work.other_ops += out or 0
    return work
