"""Models that arrive quantized: what kind of quantization a graph carries, and its float graph where one exists.

Kinds (a graph can carry several; `primary` is the most specific):
- qdq: QuantizeLinear → DequantizeLinear pairs on activations around float operators (ORT's QDQ format, NNCF and
  TensorRT exports);
- qoperator: QLinearConv / QLinearMatMul and com.microsoft's QLinear* / QGemm fused quantized operators;
- integer-ops: ConvInteger / MatMulInteger, usually after DynamicQuantizeLinear (ORT's dynamic quantization);
- weight-only: integer weights dequantized in the graph (DequantizeLinear on initializers with no activation
  quantization, a Cast → Mul of an integer initializer, or com.microsoft MatMulNBits / GatherBlockQuantized);
- contrib: com.microsoft quantized contrib operators (DynamicQuantizeLSTM, QAttention, DynamicQuantizeMatMul,
  MatMulIntegerToFloat, QEmbedLayerNormalization, ...), which only ONNX Runtime runs;
- fp16: float16 weights (reduced, not integer-quantized).

The converter never quantizes such a model again blindly (converter.search.plan): it keeps it as it is where the
target runs its operators, offers its float graph (`dequantize`, for QDQ and DequantizeLinear weight-only graphs:
the same values, in float) to the usual recipes, which ship only where the gate and the timing prove they pay,
and refuses a target that cannot run its operators, in one sentence each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter.onnx_graph import graph_nodes

QOPERATOR = {"QLinearConv", "QLinearMatMul"}
MS_QOPERATOR = {"QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
                "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearReduceMean", "QLinearWhere", "QGemm",
                "QLinearConvTranspose", "NhwcQLinearConv"}  # fmt: skip
INTEGER_OPS = {"ConvInteger", "MatMulInteger"}
MS_CONTRIB = {"DynamicQuantizeLSTM", "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
              "QEmbedLayerNormalization", "QOrderedMatMul", "QOrderedAttention", "QOrderedLayerNormalization",
              "QOrderedGelu", "QOrderedLongformerAttention", "QuickGelu_int8"}  # fmt: skip
MS_WEIGHT_ONLY = {"MatMulNBits", "GatherBlockQuantized", "MatMulBnb4", "MatMulFpQ4"}
INTEGER_TYPES = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT16,
                 TensorProto.UINT16}  # fmt: skip
ORDER = ("contrib", "qoperator", "integer-ops", "qdq", "weight-only", "fp16")
PRECISION = {"contrib": "int8-dynamic", "qoperator": "int8-static", "integer-ops": "int8-dynamic",
             "qdq": "int8-static", "weight-only": "int8-weights", "fp16": "fp16"}  # fmt: skip


@dataclass(frozen=True)
class Arrived:
    """The quantization a model arrives with."""

    kinds: tuple[str, ...]
    evidence: dict[str, list[str]] = field(default_factory=dict)
    contrib_ops: tuple[str, ...] = ()  # com.microsoft quantized operators: only ONNX Runtime runs them
    integer_weights: tuple[str, ...] = ()  # integer initializers the graph dequantizes itself
    dequantizable: bool = False  # `dequantize` gives its float graph

    @property
    def primary(self) -> str:
        return next(k for k in ORDER if k in self.kinds)

    @property
    def precision(self) -> str:
        """The manifest's precision for a bundle that keeps it as it is."""
        return PRECISION[self.primary]

    def describe(self) -> str:
        shown = "; ".join(f"{kind}: {', '.join(self.evidence.get(kind, []))}" for kind in self.kinds)
        return f"{' + '.join(self.kinds)} ({shown})"

    def as_dict(self) -> dict[str, object]:
        return {"kinds": list(self.kinds), "primary": self.primary, "evidence": self.evidence,
                "contrib_ops": list(self.contrib_ops), "dequantizable": self.dequantizable}  # fmt: skip


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    found = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            found[node.output[0]] = node.attribute[0].t
    return found


def detect(model: onnx.ModelProto) -> Arrived | None:
    """The quantization `model` carries (None: a float model)."""
    consts = _constants(model)
    nodes = graph_nodes(model.graph)
    producer = {out: node for node in nodes for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def constant(name: str, depth: int = 0) -> bool:
        if name in consts:
            return True
        node = producer.get(name)
        plumbing = ("Identity", "Reshape", "Transpose", "Cast", "Unsqueeze", "Squeeze")
        return node is not None and depth < 4 and node.op_type in plumbing and constant(node.input[0], depth + 1)

    evidence: dict[str, list[str]] = {}
    counts = Counter((node.domain or "", node.op_type) for node in nodes)
    quantize = [n for n in nodes if n.op_type == "QuantizeLinear"]
    dequantize = [n for n in nodes if n.op_type == "DequantizeLinear"]
    activation_q = [n for n in quantize if not constant(n.input[0])]
    weight_dq = [n for n in dequantize if constant(n.input[0])]
    if activation_q and len(weight_dq) < len(dequantize):
        evidence["qdq"] = [f"{len(activation_q)} activation QuantizeLinear, {len(dequantize)} DequantizeLinear"]
    elif weight_dq:
        evidence["weight-only"] = [f"{len(weight_dq)} DequantizeLinear on integer weights, no activation quantization"]
    for (domain, op), count in sorted(counts.items()):
        standard = domain in ("", "ai.onnx")
        if (standard and op in QOPERATOR) or (domain == "com.microsoft" and op in MS_QOPERATOR):
            evidence.setdefault("qoperator", []).append(f"{op} x{count}")
        elif standard and op in INTEGER_OPS:
            evidence.setdefault("integer-ops", []).append(f"{op} x{count}")
        elif standard and op == "DynamicQuantizeLinear":
            evidence.setdefault("integer-ops", []).append(f"DynamicQuantizeLinear x{count}")
        elif domain == "com.microsoft" and op in MS_WEIGHT_ONLY:
            evidence.setdefault("weight-only", []).append(f"com.microsoft::{op} x{count}")
        elif domain == "com.microsoft" and (
            op in MS_CONTRIB or ("Quant" in op and op not in ("QuantizeLinear", "DequantizeLinear"))
        ):
            evidence.setdefault("contrib", []).append(f"com.microsoft::{op} x{count}")  # fmt: skip
    integer = {n: t for n, t in consts.items() if t.data_type in INTEGER_TYPES and int(np.prod(t.dims or [1])) >= 256}
    cast_weights = [
        name for name in integer
        if any(c.op_type == "Cast" and any(u.op_type in ("Mul", "Sub", "Div") for u in consumers.get(c.output[0], []))
               for c in consumers.get(name, []))
    ]  # fmt: skip
    if cast_weights:
        evidence.setdefault("weight-only", []).append(f"{len(cast_weights)} integer weights dequantized by Cast → Mul")
    halves = sum(1 for t in consts.values() if t.data_type == TensorProto.FLOAT16 and int(np.prod(t.dims or [1])) > 16)
    if halves:
        evidence["fp16"] = [f"{halves} float16 weights"]
    if not evidence:
        return None
    kinds = tuple(k for k in ORDER if k in evidence)
    contrib = tuple(sorted({n.op_type for n in nodes if n.domain == "com.microsoft" and
                            any(n.op_type in e for e in evidence.get("contrib", []))}))  # fmt: skip
    dequantizable = (
        set(kinds) <= {"qdq", "weight-only"}
        and not cast_weights
        and not any(counts.get(("com.microsoft", op)) for op in MS_WEIGHT_ONLY)
    )
    return Arrived(kinds, evidence, contrib, tuple(sorted(integer)), dequantizable)


def dequantize(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The float graph of a QDQ or DequantizeLinear weight-only model (None: it holds other quantized operators, a
    quantized graph input, or per-channel activation scales): weights dequantized into float initializers (a
    QuantizeLinear of a float constant keeps its rounding), each activation Quantize → Dequantize pair replaced by
    the Clip to the integer range it implies. The values differ from the quantized graph's by the activation
    rounding only."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = {init.name: init for init in graph.initializer}
    folded: dict[str, np.ndarray] = {}
    clips: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []  # (a DequantizeLinear, the Clip in its place)
    drop: list[onnx.NodeProto] = []
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in consts:
            folded[node.output[0]] = _quantize(node, consts)
            drop.append(node)
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        source = node.input[0]
        if source in consts or source in folded:
            values = folded[source] if source in folded else numpy_helper.to_array(consts[source])
            folded[node.output[0]] = _dequantize(node, values, consts)
            drop.append(node)
            continue
        quantizer = producer.get(source)
        if quantizer is None or quantizer.op_type != "QuantizeLinear":
            return None  # a quantized tensor that comes from outside (a graph input): no float graph
        # The pair clips to the integer range (a QDQ graph drops the Relu that uint8 with zero point 0 implies):
        # the float graph keeps the clip, and loses only the rounding.
        try:
            low, high = _range(quantizer, consts)
        except ValueError:
            return None
        names = (f"{node.output[0]}_low", f"{node.output[0]}_high")
        folded[names[0]], folded[names[1]] = low, high
        clips.append((node, helper.make_node("Clip", [quantizer.input[0], *names], [node.output[0]],
                                             name=f"{node.name or node.output[0]}_clip")))  # fmt: skip
        drop.append(node)
    dropped = {id(n) for n in drop}
    replacement = {id(dq): clip for dq, clip in clips}
    kept = [replacement.get(id(n), n) for n in graph.node if id(n) not in dropped or id(n) in replacement]
    used = {name for n in kept for name in n.input}
    kept = [n for n in kept if not (n.op_type == "QuantizeLinear" and n.output[0] not in used)]
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in kept):
        return None
    outputs = {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(kept)
    needed = {name for n in _all(kept) for name in n.input} | outputs
    keep_inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in folded.items() if name in needed)
    inputs = [i for i in graph.input if i.name in needed or i.name not in consts]
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.value_info[:]
    return out


def _all(nodes: list[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    for node in nodes:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _all(list(sub.node))


def _param(node: onnx.NodeProto, index: int, consts: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    if index >= len(node.input) or not node.input[index]:
        return None
    return numpy_helper.to_array(consts[node.input[index]])


def _broadcast(param: np.ndarray, values: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    if param.ndim == 0 or param.size == 1:
        return param.reshape(())
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    axis = axis if axis >= 0 else axis + values.ndim
    block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
    if block:  # blocked quantization: one parameter per block along the axis
        param = np.repeat(param, block, axis=axis)[tuple(slice(0, d) for d in values.shape)]
        return param
    shape = [1] * values.ndim
    shape[axis] = param.size
    return param.reshape(shape)


def _dequantize(node: onnx.NodeProto, values: np.ndarray, consts: dict[str, onnx.TensorProto]) -> np.ndarray:
    scale = _param(node, 1, consts)
    zero = _param(node, 2, consts)
    assert scale is not None
    result = values.astype(np.float64)
    if zero is not None:
        result = result - _broadcast(zero.astype(np.float64), values, node)
    return (result * _broadcast(scale.astype(np.float64), values, node)).astype(scale.dtype)


def _range(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto]) -> tuple[np.ndarray, np.ndarray]:
    """The float range a QuantizeLinear keeps: (qmin - zero) * scale to (qmax - zero) * scale."""
    scale = _param(node, 1, consts)
    zero = _param(node, 2, consts)
    assert scale is not None
    dtype = helper.tensor_dtype_to_np_dtype(consts[node.input[2]].data_type) if zero is not None else np.uint8
    info = np.iinfo(dtype)
    shift = zero.astype(np.float64) if zero is not None else 0.0
    low = (info.min - shift) * scale.astype(np.float64)
    high = (info.max - shift) * scale.astype(np.float64)
    if np.size(scale) != 1:
        raise ValueError("per-channel activation quantization")
    return np.asarray(low, scale.dtype).reshape(()), np.asarray(high, scale.dtype).reshape(())


def _quantize(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto]) -> np.ndarray:
    values = numpy_helper.to_array(consts[node.input[0]]).astype(np.float64)
    scale = _param(node, 1, consts)
    zero = _param(node, 2, consts)
    assert scale is not None
    dtype = helper.tensor_dtype_to_np_dtype(consts[node.input[2]].data_type) if zero is not None else np.uint8
    info = np.iinfo(dtype)
    shift = _broadcast(zero.astype(np.float64), values, node) if zero is not None else 0.0
    q = np.rint(values / _broadcast(scale.astype(np.float64), values, node)) + shift
    return np.clip(q, info.min, info.max).astype(dtype)
