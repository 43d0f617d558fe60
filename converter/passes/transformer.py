"""Transformer encoders: recognizing their blocks, and ONNX Runtime's transformer fusions as a graph pass.

`encoder` reads the graph for the blocks of an encoder: attention (a Softmax over the product of two activations),
LayerNormalization (the op, or its ReduceMean → Sub → Pow → ReduceMean → Add → Sqrt → Div decomposition),
GELU / FastGELU (Gelu, an Erf, or the tanh approximation) and embedding lookups (a Gather from a 2-D float table).
A graph with attention, a normalization and matrix products is an encoder, and gets the transformer recipes
(converter.search.plan): ORT dynamic INT8 per channel, static INT8 with Softmax / LayerNorm / Add in float, NNCF
with model_type=TRANSFORMER and SmoothQuant, weight-only INT8/INT4 matrix products (MatMulNBits, NNCF
compress_weights), and the fused graph for ONNX Runtime.

`fuse` runs `onnxruntime.transformers.optimizer` (Attention / MultiHeadAttention, SkipLayerNormalization,
EmbedLayerNormalization, BiasGelu / FastGelu): com.microsoft operators only ONNX Runtime runs, so the fused graph
is an ONNX Runtime candidate, gated like any pass. A graph the optimizer fuses nothing in is refused (no pass).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx

from edgefleet.converter.onnx_graph import graph_nodes
from edgefleet.converter.passes.graph import copy_model
from edgefleet.converter.scratch import scratch_cwd
from edgefleet.core.errors import ConversionError

log = logging.getLogger(__name__)

# Operators whose inputs the transformer INT8 recipes keep in float: the softmax, the normalizations and the
# residual additions carry the outliers that break per-tensor INT8 (the BERT: cosine 0.64 with QDQ on
# everything).
FLOAT_OPS = ("Softmax", "LayerNormalization", "Add", "ReduceMean", "Pow", "Sqrt", "Div", "Erf", "Tanh")
FUSED = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu",
         "FastGelu", "Gelu", "SkipSimplifiedLayerNormalization")  # fmt: skip


@dataclass(frozen=True)
class Encoder:
    """The blocks found in a graph."""

    attention: int  # Softmax nodes over a product of two activations
    layer_norms: int
    gelus: int
    embeddings: int  # Gathers from 2-D float tables
    matmuls: int

    def describe(self) -> str:
        return (
            f"{self.attention} attention softmax, {self.layer_norms} LayerNorm, {self.gelus} GELU, "
            f"{self.embeddings} embedding lookups, {self.matmuls} matrix products"
        )


def encoder(model: onnx.ModelProto) -> Encoder | None:
    """The encoder blocks of `model`, or None when it has none (attention and a normalization, at least)."""
    nodes = graph_nodes(model.graph)
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in nodes for o in n.output}
    ops = Counter(n.op_type for n in nodes)

    def from_activation_product(name: str, depth: int = 0) -> bool:
        node = producer.get(name)
        if node is None or depth > 4:
            return False
        if node.op_type == "MatMul":
            return all(i not in inits for i in node.input[:2])
        return node.op_type in ("Add", "Div", "Mul", "Where", "Cast") and any(
            from_activation_product(i, depth + 1) for i in node.input
        )

    attention = sum(1 for n in nodes if n.op_type == "Softmax" and from_activation_product(n.input[0]))
    decomposed = sum(1 for n in nodes if n.op_type == "Sqrt" and producer.get(n.input[0]) is not None
                     and producer[n.input[0]].op_type == "Add")  # fmt: skip
    norms = ops["LayerNormalization"] + ops["SimplifiedLayerNormalization"] + ops["SkipLayerNormalization"]
    norms += min(decomposed, ops["ReduceMean"] // 2)
    gelus = ops["Gelu"] + ops["FastGelu"] + ops["BiasGelu"] + ops["Erf"] + ops["Tanh"]
    embeddings = sum(
        1 for n in nodes if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2
        and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT and inits[n.input[0]].dims[0] >= 16
    )  # fmt: skip
    matmuls = ops["MatMul"] + ops["Gemm"]
    if attention == 0 or norms == 0 or matmuls < 4:
        return None
    return Encoder(attention, norms, gelus, embeddings, matmuls)


def attention_geometry(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(num_heads, hidden_size) read from the graph, for ONNX Runtime's attention fusion, whose own detection reads
    them from constant Reshape shapes and fails on exports that compute those shapes (transformers 5's BERT: then
    it fuses no Attention at all). The hidden size is the width of the normalizations' scales; the head size
    comes from the attention's scale, the scalar that multiplies (1/√d) or divides (√d) the query-key product
    ahead of the Softmax. None when either is not found or they do not divide."""
    nodes = graph_nodes(model.graph)
    values = {i.name: i for i in model.graph.initializer}
    values.update({n.output[0]: n.attribute[0].t for n in nodes if n.op_type == "Constant" and n.attribute
                   and n.attribute[0].name == "value"})  # fmt: skip
    producer = {o: n for n in nodes for o in n.output}

    def scalar(name: str) -> float | None:
        tensor = values.get(name)
        if tensor is None:
            return None
        array = onnx.numpy_helper.to_array(tensor)
        return float(array.ravel()[0]) if array.size == 1 and array.dtype.kind == "f" else None

    def head_size(name: str, depth: int = 0) -> int | None:
        node = producer.get(name)
        if node is None or depth > 4:
            return None
        if node.op_type in ("Mul", "Div"):
            for other in node.input:
                value = scalar(other)
                if value and value > 0:
                    size = 1.0 / value**2 if node.op_type == "Mul" else value**2
                    if 4 <= size <= 1024 and abs(size - round(size)) < 0.01:
                        return round(size)
        if node.op_type in ("Add", "Where", "Cast", "Mul", "Div", "MatMul"):
            for found in (head_size(i, depth + 1) for i in node.input):
                if found:
                    return found
        return None

    widths = Counter(
        int(values[n.input[1]].dims[-1]) for n in nodes
        if n.op_type in ("LayerNormalization", "SkipLayerNormalization") and len(n.input) > 1 and n.input[1] in values
        and isinstance(values[n.input[1]], onnx.TensorProto) and values[n.input[1]].dims
    )  # fmt: skip
    heads = Counter(h for n in nodes if n.op_type == "Softmax" and (h := head_size(n.input[0])))
    if not widths or not heads:
        return None
    hidden, head = widths.most_common(1)[0][0], heads.most_common(1)[0][0]
    return (hidden // head, hidden) if hidden % head == 0 and hidden > head else None


@dataclass(frozen=True)
class FusionConfig:
    model_type: str = "bert"
    num_heads: int = 0  # 0: attention_geometry reads them from the graph, or else the optimizer does
    hidden_size: int = 0

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {"model_type": self.model_type, "num_heads": self.num_heads, "hidden_size": self.hidden_size}


def fuse(model: onnx.ModelProto, config: FusionConfig = FusionConfig()) -> tuple[onnx.ModelProto, dict[str, int]]:
    """ONNX Runtime's transformer fusions on `model` (not changed), and how many of each fused operator it made;
    ConversionError when it fuses nothing. Heads and hidden size left at 0 are read by attention_geometry."""
    from onnxruntime.transformers.optimizer import optimize_model

    if not (config.num_heads and config.hidden_size) and (geometry := attention_geometry(model)):
        config = FusionConfig(config.model_type, *geometry)
    for name in ("onnxruntime.transformers", "fusion_attention"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with scratch_cwd(), contextlib.redirect_stdout(io.StringIO()):
            optimized = optimize_model(copy_model(model), model_type=config.model_type, num_heads=config.num_heads,
                                       hidden_size=config.hidden_size, opt_level=0)  # fmt: skip
    except Exception as err:  # the optimizer raises whatever its pattern matchers hit
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"transformer fusion failed: {first}") from err
    counts = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n and op in FUSED}
    if not counts:
        raise ConversionError("ONNX Runtime's transformer optimizer found nothing to fuse in this graph")
    fused = optimized.model
    if not any(imp.domain == "com.microsoft" for imp in fused.opset_import):
        fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return fused, counts


def weight_share(model: onnx.ModelProto) -> float:
    """Share of the weights held by matrix products (what weight-only quantization shrinks)."""
    sizes = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer if len(i.dims) == 2}
    total = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    products = {name for n in graph_nodes(model.graph) if n.op_type in ("MatMul", "Gemm") for name in n.input}
    return sum(v for k, v in sizes.items() if k in products) / total if total else 0.0
