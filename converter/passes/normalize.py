"""Recorded passes that make what exporters write usable before anything else looks at the model.

- Negative or zero `dim_value`s (Paddle2ONNX writes -1 for a dynamic dimension, some exporters 0) become
  symbolic dimensions, in the inputs, the outputs and the recorded value infos.
- Non-tensor outputs become tensors: a ZipMap (skl2onnx's and onnxmltools' default classifier output, a
  sequence of maps) is replaced by its input, the probability matrix, and its class labels are returned so the
  manifest can carry them. Any other non-tensor output is refused, naming it.
- Weights listed as graph inputs (IR 3 and older exporters list every initializer as an input too, which makes
  it an input a caller may override: runtimes then neither fold nor pre-pack it) become plain initializers.
- A model file over protobuf's 2 GB limit is refused before it is read, in one sentence; a model whose weights
  are in external data files may be larger: it is read without them (converter/large_model.py).

Each pass is a pure function of the proto and returns what it changed, so the conversion records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from edgefleet.core.bundle.manifest import PassRecord
from edgefleet.core.errors import ModelError

PROTOBUF_LIMIT = 2**31 - 1  # bytes: one serialized ModelProto can hold no more


@dataclass
class Normalized:
    proto: onnx.ModelProto
    passes: list[PassRecord] = field(default_factory=list)
    class_labels: dict[str, list[str | int]] = field(default_factory=dict)  # output → its columns' classes


def external_bytes(path: Path) -> int:
    """Bytes of weights the model keeps in external data files (0 when it keeps none)."""
    proto = onnx.load(str(path), load_external_data=False)
    total = 0
    seen: set[str] = set()
    for tensor in all_initializers(proto.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        if "length" in info:
            total += int(info["length"])
        elif info.get("location") and info["location"] not in seen:
            seen.add(info["location"])
            file = path.parent / info["location"]
            total += file.stat().st_size if file.is_file() else 0
    return total


def model_bytes(path: Path) -> int:
    """The model file plus the external data it names."""
    return path.stat().st_size + external_bytes(path)


def is_large(path: Path) -> bool:
    """Over protobuf's limit for one serialized model (read at call time, so tests can lower it)."""
    return model_bytes(path) > PROTOBUF_LIMIT


def check_size(path: Path) -> None:
    """Refuse, before reading it, a model file that protobuf itself cannot parse; a model whose weights are in
    external data files may be larger (converter/large_model.py)."""
    if path.stat().st_size > PROTOBUF_LIMIT:
        raise ModelError(
            f"{path.name} is {path.stat().st_size / 2**30:.2f} GiB in one file: over protobuf's 2 GiB limit for "
            "one model, which nothing can parse; save it with its weights as external data "
            "(onnx.save(model, path, save_as_external_data=True))"
        )


def all_initializers(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    found = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                found.extend(all_initializers(sub))
    return found


def symbolic_dims(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """Dimensions written as dim_value <= 0 become dim_params; returns the model and what changed (name → axes)."""
    changed: dict[str, list[int]] = {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in list(out.graph.input) + list(out.graph.output) + list(out.graph.value_info):
        if not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.dim_param = f"{value.name}_dim{axis}"  # setting the oneof clears dim_value
                changed.setdefault(value.name, []).append(axis)
    return out, changed


def _zipmap_labels(node: onnx.NodeProto) -> list[str | int]:
    for attr in node.attribute:
        if attr.name == "classlabels_int64s" and attr.ints:
            return [int(v) for v in attr.ints]
        if attr.name == "classlabels_strings" and attr.strings:
            return [s.decode() for s in attr.strings]
    return []


def tensor_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, list[str | int]]]:
    """Replace each ZipMap feeding a graph output by an Identity of its probability tensor.

    The output keeps its name; it becomes a float tensor [N, classes] whose columns are the returned labels.
    """
    producers = {out: node for node in model.graph.node for out in node.output}
    labels: dict[str, list[str | int]] = {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for index, value in enumerate(out.graph.output):
        if value.type.HasField("tensor_type"):
            continue
        node = producers.get(value.name)
        kind = _type_text(value.type)
        if node is None or node.op_type != "ZipMap" or node.domain != "ai.onnx.ml":
            producer = f"{node.domain or 'ai.onnx'}::{node.op_type}" if node else "a graph input"
            raise ModelError(
                f"output {value.name!r} is a {kind} produced by {producer}; only ZipMap outputs (sequences of maps) "
                "are turned into tensors: export that output as a tensor"
            )
        labels[value.name] = _zipmap_labels(node)
        position = list(out.graph.node).index(next(n for n in out.graph.node if n.output == node.output))
        identity = helper.make_node("Identity", [node.input[0]], [value.name], name=f"{node.name or 'ZipMap'}_tensor")
        del out.graph.node[position]
        out.graph.node.insert(position, identity)
        tensor = helper.make_tensor_value_info(value.name, TensorProto.FLOAT, [None, len(labels[value.name]) or None])
        out.graph.output.remove(value)
        out.graph.output.insert(index, tensor)
    if labels:
        used = {node.domain for node in out.graph.node}
        if "ai.onnx.ml" not in used:
            kept = [imp for imp in out.opset_import if imp.domain != "ai.onnx.ml"]
            del out.opset_import[:]
            out.opset_import.extend(kept)
    return out, labels


def _type_text(value_type: onnx.TypeProto) -> str:
    if value_type.HasField("sequence_type"):
        return f"sequence of {_type_text(value_type.sequence_type.elem_type)}"
    if value_type.HasField("map_type"):
        key = helper.tensor_dtype_to_np_dtype(value_type.map_type.key_type)
        return f"map({key} → {_type_text(value_type.map_type.value_type)})"
    if value_type.HasField("optional_type"):
        return f"optional {_type_text(value_type.optional_type.elem_type)}"
    if value_type.HasField("tensor_type"):
        return str(helper.tensor_dtype_to_np_dtype(value_type.tensor_type.elem_type))
    return "value of unknown type"


def weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with graph inputs that are also initializers dropped from the inputs (IR raised to 4, which
    allows initializers that are not inputs), and their names."""
    initializers = {init.name for init in model.graph.initializer}
    listed = [i.name for i in model.graph.input if i.name in initializers]
    if not listed:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [i for i in out.graph.input if i.name not in initializers]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.ir_version = max(out.ir_version, 4)
    return out, listed


def normalize(model: onnx.ModelProto, fold_weight_inputs: bool = True) -> Normalized:
    """`fold_weight_inputs` False: a model run from its path as exported (over protobuf's limit) keeps them."""
    done = Normalized(model)
    model, folded = weights_as_inputs(model) if fold_weight_inputs else (model, [])
    if folded:
        done.passes.append(PassRecord(name="weights-as-inputs", params={"initializers": len(folded)}))
    proto, changed = symbolic_dims(model)
    if changed:
        done.passes.append(
            PassRecord(name="symbolic-dims", params={name: str(axes) for name, axes in sorted(changed.items())})
        )
    proto, labels = tensor_outputs(proto)
    if labels:
        done.passes.append(PassRecord(name="zipmap-to-tensor", params={name: "probabilities" for name in labels}))
        done.class_labels = labels
    done.proto = proto
    return done
