"""Loading an ONNX model with clear errors, and reading its signature and opsets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from edgefleet.core.bundle import sha256_file
from edgefleet.core.errors import ModelError
from edgefleet.core.manifest import TensorSpec

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"})


@dataclass(frozen=True)
class SourceModel:
    path: Path
    proto: onnx.ModelProto
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: dict[str, int]

    @property
    def custom_domains(self) -> dict[str, int]:
        return {d: v for d, v in self.opset.items() if d not in STANDARD_DOMAINS}


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


def load_model(path: Path) -> SourceModel:
    """Read and check an ONNX file; ModelError with one clear sentence if it is not usable."""
    if not path.is_file():
        raise ModelError(f"model file {path} not found")
    try:
        proto = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, OSError) as err:
        raise ModelError(f"{path} is not an ONNX model (cannot parse protobuf: {err})") from err
    if not proto.graph.node or not proto.opset_import:
        raise ModelError(f"{path} is not an ONNX model (no graph nodes or no opset import)")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"{path} is not a valid ONNX model: {first}") from err
    initializers = {init.name for init in proto.graph.initializer}
    return SourceModel(
        path=path,
        proto=proto,
        sha256=sha256_file(path),
        inputs=[tensor_spec(v) for v in proto.graph.input if v.name not in initializers],
        outputs=[tensor_spec(v) for v in proto.graph.output],
        opset={(imp.domain or ""): int(imp.version) for imp in proto.opset_import},
    )


def _graph_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node, including those inside If/Loop/Scan subgraphs."""
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        nodes.append(node)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                nodes.extend(_graph_nodes(attr.g))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    nodes.extend(_graph_nodes(sub))
    return nodes


def count_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """Operator counts keyed `domain::op` for custom domains and plain `op` for the default one."""
    counts: dict[str, int] = {}
    for node in _graph_nodes(proto.graph):
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
