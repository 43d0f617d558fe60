"""Graph passes: pure functions (model, config) → new model. The input proto is never mutated.

Every pass here writes portable ONNX (standard domains only, plus whatever custom domains the input already
had), so any runtime can read the result; runtime-specific fusions happen when the device loads the model.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgefleet.converter.onnx_graph import graph_nodes
from edgefleet.converter.scratch import scratch_cwd
from edgefleet.core.custom_ops.packages import STANDARD_DOMAINS
from edgefleet.core.errors import ConversionError, UserInputError

log = logging.getLogger(__name__)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def default_opset(model: onnx.ModelProto) -> int:
    return next((int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


def check_portable(before: onnx.ModelProto, after: onnx.ModelProto, step: str) -> None:
    allowed = STANDARD_DOMAINS | {i.domain for i in before.opset_import}
    foreign = sorted({n.domain for n in graph_nodes(after.graph)} - allowed)
    if foreign:
        raise ConversionError(f"{step} introduced non-portable domains {foreign}")


# --- opset conversion -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpsetConfig:
    target: int


def convert_opset(model: onnx.ModelProto, config: OpsetConfig) -> onnx.ModelProto:
    """Move the default-domain opset to `config.target` with onnx's version converter."""
    current = default_opset(model)
    if current == config.target:
        return copy_model(model)
    if not current:
        raise ConversionError("the model imports no default-domain opset, so it cannot be converted")
    try:
        converted = onnx.version_converter.convert_version(copy_model(model), config.target)
        onnx.checker.check_model(converted)
    except Exception as err:  # the converter raises RuntimeError / ValidationError / its own C++ errors
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(f"cannot convert opset {current} to {config.target}: {first}") from err
    return converted


# --- shape inference ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeConfig:
    symbolic: bool = True


def infer_shapes(model: onnx.ModelProto, config: ShapeConfig = ShapeConfig()) -> onnx.ModelProto:
    """ONNX shape inference with data propagation, then ONNX Runtime's symbolic inference when it can."""
    out = onnx.shape_inference.infer_shapes(copy_model(model), strict_mode=False, data_prop=True)
    if config.symbolic:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        try:
            with scratch_cwd():
                symbolic = SymbolicShapeInference.infer_shapes(
                    copy_model(out), auto_merge=True, guess_output_rank=False
                )
        except Exception as err:  # it raises bare Exceptions on ops it does not know (e.g. ai.onnx.ml)
            log.info("symbolic shape inference skipped: %s", err)
        else:
            if symbolic is not None:
                out = symbolic
    return out


# --- constant folding and cleanup -------------------------------------------------------------------------


@dataclass(frozen=True)
class FoldConfig:
    size_limit: int = 1 << 18  # largest folded constant, in elements
    keep: tuple[str, ...] = ()  # initializers left unfolded (a quantized model's integer weights stay integer)


def fold_constants(model: onnx.ModelProto, config: FoldConfig = FoldConfig()) -> onnx.ModelProto:
    """Constant folding (If with a constant condition is inlined), dead-node and unused-initializer removal."""
    import onnxscript.optimizer

    work = copy_model(model)
    held = [init for init in work.graph.initializer if init.name in set(config.keep)]
    if held:  # shown to the folder as graph inputs, so nothing computed from them is folded
        for init in held:
            work.graph.initializer.remove(init)
            work.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    try:
        folded = onnxscript.optimizer.optimize(work, output_size_limit=config.size_limit)
    except Exception as err:  # onnxscript raises a variety of errors on graphs it cannot handle
        raise ConversionError(f"constant folding failed: {err}") from err
    assert isinstance(folded, onnx.ModelProto)
    if held:
        names = {init.name for init in held}
        inputs = [i for i in folded.graph.input if i.name not in names]
        del folded.graph.input[:]
        folded.graph.input.extend(inputs)
        folded.graph.initializer.extend(held)
    folded = drop_unused_initializers(folded)
    check_portable(model, folded, "constant folding")
    return folded


def drop_unused_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    out = copy_model(model)
    used = {name for node in graph_nodes(out.graph) for name in node.input} | {o.name for o in out.graph.output}
    keep = [init for init in out.graph.initializer if init.name in used]
    if len(keep) != len(out.graph.initializer):
        del out.graph.initializer[:]
        out.graph.initializer.extend(keep)
        inputs = [i for i in out.graph.input if i.name in used or i.name not in _initializer_names(model)]
        del out.graph.input[:]
        out.graph.input.extend(inputs)
    return out


def _initializer_names(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


# --- Conv + BatchNormalization fusion -----------------------------------------------------------------------


@dataclass(frozen=True)
class FuseConfig:
    pass


def fuse_conv_bn(model: onnx.ModelProto, config: FuseConfig = FuseConfig()) -> onnx.ModelProto:
    """Fold inference-mode BatchNormalization into the Conv before it (weights and bias rescaled).

    A following Relu stays a node: standard ONNX Conv has no activation attribute, and every runtime fuses
    Conv+Relu itself when it loads the model.
    """
    out = copy_model(model)
    graph = out.graph
    inits = {init.name: init for init in graph.initializer}
    consumers = Counter(name for node in graph_nodes(graph) for name in node.input)
    graph_outputs = {o.name for o in graph.output}
    producer = {o: node for node in graph.node for o in node.output}
    removed: set[int] = set()
    for bn in list(graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1 or bn.domain not in ("", "ai.onnx"):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or consumers[conv.output[0]] != 1 or conv.output[0] in graph_outputs:
            continue
        names = [conv.input[1], *bn.input[1:5]] + ([conv.input[2]] if len(conv.input) > 2 and conv.input[2] else [])
        if not all(n in inits for n in names):
            continue
        weight = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        scale, beta, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        bias = (
            numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
            if len(conv.input) > 2 and conv.input[2]
            else np.zeros(weight.shape[0])
        )
        factor = scale / np.sqrt(var + eps)
        dtype = numpy_helper.to_array(inits[conv.input[1]]).dtype
        new_w = (weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))).astype(dtype)
        new_b = ((bias - mean) * factor + beta).astype(dtype)
        w_name, b_name = f"{conv.name or conv.output[0]}_fused_W", f"{conv.name or conv.output[0]}_fused_B"
        graph.initializer.extend([numpy_helper.from_array(new_w, w_name), numpy_helper.from_array(new_b, b_name)])
        conv_inputs = [conv.input[0], w_name, b_name]
        del conv.input[:]
        conv.input.extend(conv_inputs)
        conv.output[0] = bn.output[0]
        removed.add(id(bn))
    if not removed:
        return out
    nodes = [n for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return drop_unused_initializers(out)


# --- redundant node removal -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanupConfig:
    op_types: tuple[str, ...] = ("Identity", "Cast", "Transpose", "Reshape", "Dropout")


def remove_redundant(model: onnx.ModelProto, config: CleanupConfig = CleanupConfig()) -> onnx.ModelProto:
    """Remove no-op Identity/Dropout/Cast/Transpose/Reshape nodes and collapse Transpose∘Transpose and
    Reshape∘Reshape chains in the main graph. Nodes whose output is a graph output are kept."""
    out = infer_shapes(model, ShapeConfig(symbolic=False))
    graph = out.graph
    types = _elem_types(out)
    shapes = _static_shapes(out)
    graph_outputs = {o.name for o in graph.output}
    consumers = Counter(name for node in graph_nodes(graph) for name in node.input)
    producer = {o: node for node in graph.node for o in node.output}
    inits = {init.name: init for init in graph.initializer}
    rename: dict[str, str] = {}
    dropped: set[int] = set()
    for node in graph.node:
        if node.op_type not in config.op_types or node.domain not in ("", "ai.onnx"):
            continue
        src, dst = (node.input[0] if node.input else ""), node.output[0]
        if not src or dst in graph_outputs:
            continue
        noop = False
        if node.op_type == "Identity" or (node.op_type == "Dropout" and len(node.output) == 1):
            noop = True
        elif node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            noop = to is not None and types.get(src) == to
        elif node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            noop = perm is not None and perm == sorted(perm)
            first = producer.get(src)
            if not noop and perm is not None and first is not None and first.op_type == "Transpose":
                inner = next((list(a.ints) for a in first.attribute if a.name == "perm"), None)
                if inner is not None and consumers[src] == 1 and id(first) not in dropped:
                    composed = [inner[p] for p in perm]
                    node.input[0] = first.input[0]
                    del node.attribute[:]
                    node.attribute.extend([helper.make_attribute("perm", composed)])
                    dropped.add(id(first))
                    noop = composed == sorted(composed)
                    src = node.input[0]
        elif node.op_type == "Reshape":
            first = producer.get(src)
            if first is not None and first.op_type == "Reshape" and consumers[src] == 1 and id(first) not in dropped:
                node.input[0] = first.input[0]
                dropped.add(id(first))
                src = node.input[0]
            target = inits.get(node.input[1]) if len(node.input) > 1 else None
            if target is not None and src in shapes:
                wanted = numpy_helper.to_array(target).tolist()
                noop = all(d > 0 for d in wanted) and wanted == shapes[src]
        if noop:
            rename[dst] = rename.get(src, src)
            dropped.add(id(node))
    if not dropped:
        return copy_model(model)
    nodes = [n for n in graph.node if id(n) not in dropped]
    for node in graph_nodes(graph):
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return drop_unused_initializers(out)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {init.name: init.data_type for init in model.graph.initializer}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.type.HasField("tensor_type"):
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return types


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for vi in [*model.graph.input, *model.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [int(d.dim_value) for d in dims]
    return shapes


# --- fixing dimensions and pinning inputs -------------------------------------------------------------------


@dataclass(frozen=True)
class FixDimsConfig:
    """`dims` fixes symbolic dimensions by name everywhere; `shapes` fixes whole input shapes by input name."""

    dims: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)


def fix_dims(model: onnx.ModelProto, config: FixDimsConfig) -> onnx.ModelProto:
    out = copy_model(model)
    inputs = {i.name: i for i in out.graph.input if i.name not in _initializer_names(out)}
    unknown = sorted(set(config.shapes) - set(inputs))
    if unknown:
        raise UserInputError(f"cannot fix the shape of {unknown}: the model's inputs are {sorted(inputs)}")
    for name, shape in config.shapes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise UserInputError(f"input {name!r} has rank {len(dims)}, cannot fix it to {shape}")
        # The whole shape replaces what was declared, fixed values too: exporters write placeholders ([1, 3, 1, 1])
        # that the real input does not have (converter.conversion hints at --input-shape for them).
        for dim, value in zip(dims, shape, strict=True):
            dim.Clear()
            dim.dim_value = int(value)
    for vi in [*out.graph.input, *out.graph.output]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in config.dims:
                value = config.dims[dim.dim_param]
                dim.Clear()
                dim.dim_value = int(value)
    del out.graph.value_info[:]
    return infer_shapes(out, ShapeConfig(symbolic=False))


@dataclass(frozen=True)
class PinConfig:
    """Inputs the user declares constant (e.g. silero-vad's sample rate), with their values."""

    values: dict[str, np.ndarray]


def pin_inputs(model: onnx.ModelProto, config: PinConfig) -> onnx.ModelProto:
    """Turn declared-constant inputs into initializers so folding can specialise the graph on them."""
    out = copy_model(model)
    inputs = {i.name for i in out.graph.input} - _initializer_names(out)
    unknown = sorted(set(config.values) - inputs)
    if unknown:
        raise UserInputError(f"cannot pin {unknown}: the model's inputs are {sorted(inputs)}")
    kept = [i for i in out.graph.input if i.name not in config.values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    for name, value in config.values.items():
        out.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return out
