"""Reading an ONNX graph: its nodes with those inside If/Loop/Scan bodies, operator counts and inventory, and
tensor signatures. The bottom of the converter: every pass and stage reads graphs through it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import ModelError


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str | None]:
    dims: list[int | str | None] = []
    for dim in value_info.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def tensor_spec(value_info: onnx.ValueInfoProto) -> TensorSpec:
    elem_type = value_info.type.tensor_type.elem_type
    if elem_type == TensorProto.UNDEFINED:
        raise ModelError(f"{value_info.name!r} is not a tensor; only tensor inputs and outputs are supported")
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    return TensorSpec(name=value_info.name, dtype=str(dtype), shape=_dims(value_info))


def walk_nodes(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[onnx.NodeProto, str]]:
    """Every node with where it sits: "" for the main graph, else e.g. "If_0/then_branch"."""
    for node in graph.node:
        yield node, where
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                inner = f"{node.name or node.op_type}/{attr.name}"
                yield from walk_nodes(sub, f"{where}/{inner}" if where else inner)


def graph_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node, including those inside If/Loop/Scan subgraphs."""
    return [node for node, _ in walk_nodes(graph)]


def count_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """Operator counts keyed `domain::op` for custom domains and plain `op` for the default one."""
    counts: dict[str, int] = {}
    for node in graph_nodes(proto.graph):
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class OpUse:
    """One operator type as the model uses it: domain, the opset it is imported at, and where it occurs."""

    domain: str
    op_type: str
    opset: int
    count: int
    in_subgraphs: int
    subgraphs: list[str]


def op_inventory(proto: onnx.ModelProto) -> list[OpUse]:
    """Operators by domain and opset, counting those inside If/Loop/Scan bodies (and naming the bodies)."""
    opsets = {(imp.domain or ""): int(imp.version) for imp in proto.opset_import}
    found: dict[tuple[str, str], list[str]] = {}
    for node, where in walk_nodes(proto.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        found.setdefault((domain, node.op_type), []).append(where)
    return [
        OpUse(
            domain=domain,
            op_type=op,
            opset=opsets.get(domain, 0),
            count=len(places),
            in_subgraphs=sum(1 for w in places if w),
            subgraphs=sorted({w for w in places if w}),
        )
        for (domain, op), places in sorted(found.items())
    ]


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The inputs a caller feeds (initializers listed as inputs excluded)."""
    initializers = {init.name for init in model.graph.initializer}
    return [tensor_spec(v) for v in model.graph.input if v.name not in initializers]


def dynamic_inputs(model: onnx.ModelProto) -> list[str]:
    """Inputs with a dimension that is not a fixed value."""
    inits = {i.name for i in model.graph.initializer}
    return [
        vi.name
        for vi in model.graph.input
        if vi.name not in inits and any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
    ]


def opset_of(model: onnx.ModelProto) -> dict[str, int]:
    return {(imp.domain or ""): int(imp.version) for imp in model.opset_import}


def passthrough_outputs(model: onnx.ModelProto) -> list[str]:
    """Outputs that only hand an input back (the input itself, or through Identity nodes): kept, never judged."""
    inputs = {i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for output in model.graph.output:
        name = output.name
        while name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        if name in inputs:
            found.append(output.name)
    return found


def image_layout(shape: list[int | str | None] | tuple[int, ...]) -> str | None:
    """ "NCHW" or "NHWC" for a rank-4 image tensor whose channel axis is recognizable (1, 3 or 4 channels on one
    side, a spatial size of at least 8 on the other); None otherwise."""
    if len(shape) != 4:
        return None

    def size(d: int | str | None) -> int | None:
        return d if isinstance(d, int) and d > 0 else None

    first, last = size(shape[1]), size(shape[3])
    spatial = [size(d) for d in shape[1:3]] if last in (1, 3, 4) else [size(d) for d in shape[2:4]]
    big = all(s is None or s >= 8 for s in spatial)
    if last in (1, 3, 4) and first not in (1, 3, 4) and big:
        return "NHWC"
    if first in (1, 3, 4) and last not in (1, 3, 4) and big:
        return "NCHW"
    return None
