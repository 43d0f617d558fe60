"""Loading an ONNX model with clear errors, and reading its signature and opsets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from edgefleet.core.bundle import sha256_file
from edgefleet.core.custom_op_packages import STANDARD_DOMAINS
from edgefleet.core.errors import ModelError
from edgefleet.core.manifest import PassRecord, TensorSpec


@dataclass(frozen=True)
class SourceModel:
    path: Path
    proto: onnx.ModelProto
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: dict[str, int]
    passes: list[PassRecord] = field(default_factory=list)  # recorded rewrites made when loading (normalize)
    class_labels: dict[str, list[str | int]] = field(default_factory=dict)  # output → its columns' classes
    large: bool = False  # over protobuf's limit: `proto` holds the graph without its external data (large_model.py)

    @property
    def runnable(self) -> Path | onnx.ModelProto:
        """What a runtime should load to run the source as the converter sees it (rewritten or the file)."""
        return self.proto if self.passes and not self.large else self.path

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
    from edgefleet.converter.large_model import check_locations
    from edgefleet.converter.normalize import check_size, is_large, normalize

    if not path.is_file():
        raise ModelError(f"model file {path} not found")
    try:
        check_size(path)
        large = is_large(path)  # weights in external data beyond protobuf's limit: the graph alone is read
        proto = onnx.load(str(path), load_external_data=not large)
    except (DecodeError, ValueError, RuntimeError, OSError) as err:
        raise ModelError(f"{path} is not an ONNX model (cannot parse protobuf: {err})") from err
    if not proto.graph.node or not proto.opset_import:
        raise ModelError(f"{path} is not an ONNX model (no graph nodes or no opset import)")
    if large:
        check_locations(path, proto)
    try:
        onnx.checker.check_model(str(path) if large else proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"{path} is not a valid ONNX model: {first}") from err
    normalized = normalize(proto)
    proto = normalized.proto
    if large and normalized.passes:
        rewrites = ", ".join(f"{p.name} {p.params}" for p in normalized.passes)
        raise ModelError(
            f"{path.name} is over protobuf's 2 GiB limit with its external data, so it is converted as exported, "
            f"but it needs rewrites first ({rewrites}): export it with tensor outputs and positive or symbolic dims"
        )
    initializers = {init.name for init in proto.graph.initializer}
    return SourceModel(
        path=path,
        proto=proto,
        sha256=sha256_file(path),
        inputs=[tensor_spec(v) for v in proto.graph.input if v.name not in initializers],
        outputs=[tensor_spec(v) for v in proto.graph.output],
        opset={(imp.domain or ""): int(imp.version) for imp in proto.opset_import},
        passes=normalized.passes,
        class_labels=normalized.class_labels,
        large=large,
    )


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
