"""Which quantized layers cause a static INT8 model's loss: each layer's *local* error, and the nodes that must be
kept in float to remove it.

onnxruntime's qdq_loss_debug compares every activation of the QDQ model with the float model's: the error it
reports has accumulated through everything upstream, so one early layer that breaks (an outlier channel that
swamps a per-tensor activation scale) makes every layer after it look bad, and a ranking by it keeps the
downstream victims in float first. Here each quantized compute node is run on the float model's own inputs
instead: every QuantizeLinear of an activation reads the float model's value of that tensor, so a node's output
differs from the float model's only by what its own quantization does (its quantized inputs and weights, and
for a node whose output the model returns quantized, that output's quantization). Ranking by that local SQNR
names the layers that cause the loss.

Keeping a node in float (ORT `nodes_to_exclude`) does not take its input out of INT8 when the node that
produces that tensor quantizes its output too (ORT does, and shares the scale through Reshape/Transpose and
removed Relu/Clip): each ranked layer is therefore the group of node names that share its inputs' quantization:
the node, the shape plumbing and activations between it and the compute node upstream, and that producer.
Pure: models and data in, a ranking out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgefleet.converter import deadline
from edgefleet.converter.passes.heads import PLUMBING
from edgefleet.converter.passes.precision import QDQ_MIN_OPSET, _at_least_opset, _first_line, prepare_for_quantization
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

FLOAT_FEED = "__edgefleet_float"  # suffix of the local model's inputs that carry the float model's activations
CARRIES_SCALE = PLUMBING | {"Relu", "Clip"}  # ORT's QDQ shares the scale through these (or removes them)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class LocalLoss:
    node: str
    op_type: str
    sqnr_db: float  # of the node's output computed from float inputs, against the float model's
    group: tuple[str, ...]  # the node names to keep in float for its inputs to be float (the node first)


def local_report(
    float_model: onnx.ModelProto, qdq_model: onnx.ModelProto, data: Dataset, samples: int = 8
) -> list[LocalLoss]:
    """Every quantized compute node's local SQNR, lowest (worst) first."""
    import onnxruntime as ort

    float_model = _at_least_opset(float_model, QDQ_MIN_OPSET)  # as quantize_int8_static saw it: same node names
    with tempfile.TemporaryDirectory(prefix="edgefleet-local-") as tmp:
        prepared = onnx.load(str(prepare_for_quantization(float_model, Path(tmp))))
    float_nodes = {n.name: n for n in prepared.graph.node if n.name}
    float_tensors = {o for n in prepared.graph.node for o in n.output} | {i.name for i in prepared.graph.input}
    local, fed, watched = _local_model(qdq_model, float_nodes, float_tensors)
    if not watched:
        return []
    wanted = sorted(fed | {reference for _, reference in watched.values()})
    probe = _with_outputs(prepared, wanted)
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run the graph as written
        float_session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        local_session = ort.InferenceSession(local.SerializeToString(), options, providers=["CPUExecutionProvider"])
        signal = dict.fromkeys(watched, 0.0)
        noise = dict.fromkeys(watched, 0.0)
        local_names = [o.name for o in local.graph.output]
        for feeds in _samples(data, samples):
            deadline.check()
            values = dict(zip(wanted, float_session.run(wanted, feeds), strict=True))
            local_feeds = {i.name: feeds[i.name] for i in local.graph.input if i.name in feeds}
            local_feeds |= {t + FLOAT_FEED: values[t] for t in fed}
            got = dict(zip(local_names, local_session.run(local_names, local_feeds), strict=True))
            for name, (output, reference) in watched.items():
                want = values[reference].astype(np.float64)
                diff = got[output].astype(np.float64).reshape(want.shape) - want
                signal[name] += float(np.sum(want**2))
                noise[name] += float(np.sum(diff**2))
    except deadline.TimeBudgetSpent:
        raise
    except Exception as err:  # onnxruntime raises its own errors on graphs it cannot load or run
        raise ConversionError(f"local per-layer quantization report failed: {_first_line(err)}") from err
    producers = {o: n for n in prepared.graph.node for o in n.output}
    losses = [
        LocalLoss(name, node.op_type, _sqnr(signal[name], noise[name]), _group(node, producers))
        for name, node in ((name, float_nodes[name]) for name in watched)
    ]
    return sorted(losses, key=lambda loss: loss.sqnr_db)


def _sqnr(signal: float, noise: float) -> float:
    if noise <= 0.0:
        return 120.0
    return float(10.0 * np.log10(max(signal, 1e-30) / noise))


def _samples(data: Dataset, count: int) -> Iterator[dict[str, np.ndarray]]:
    for index in range(min(count, len(data))):
        yield {k: np.asarray(v) for k, v in data.sample(index).items()}


def _local_model(
    qdq: onnx.ModelProto, float_nodes: dict[str, onnx.NodeProto], float_tensors: set[str]
) -> tuple[onnx.ModelProto, set[str], dict[str, tuple[str, str]]]:
    """The QDQ model with every activation QuantizeLinear reading a graph input fed with the float model's value
    of that tensor; the tensors so fed; and for each quantized compute node the tensor that shows its local error
    and the float model's tensor to compare it with (node name → (local, float)). A node whose output the model
    returns quantized is compared at that output: the output's quantization is its error too (no node after it
    carries it)."""
    local = onnx.ModelProto()
    local.CopyFrom(qdq)
    graph = local.graph
    initializers = {i.name for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    returned = _returned_quantized(graph, producers)  # compute node → the graph output it returns quantized
    kept = {id(q) for chain, _ in returned.values() for q in chain}  # these keep reading the local values
    fed: set[str] = set()
    for node in graph.node:
        activation = node.input[0] in float_tensors and node.input[0] not in initializers if node.input else False
        if node.op_type == "QuantizeLinear" and activation and id(node) not in kept:
            fed.add(node.input[0])
            node.input[0] = node.input[0] + FLOAT_FEED
    graph.input.extend(helper.make_tensor_value_info(t + FLOAT_FEED, TensorProto.FLOAT, None) for t in sorted(fed))
    watched: dict[str, tuple[str, str]] = {}
    for node in graph.node:
        if node.op_type in QDQ_OPS or node.op_type in CARRIES_SCALE or node.name not in float_nodes:
            continue
        if node.op_type != float_nodes[node.name].op_type or not any(i in dequantized for i in node.input):
            continue
        output = returned.get(node.name, (None, ""))[1]
        watched[node.name] = (output, output) if output else (node.output[0], float_nodes[node.name].output[0])
    outputs = {o.name for o in graph.output}
    graph.output.extend(
        helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t, _ in watched.values() if t not in outputs
    )
    return local, fed, watched


def _returned_quantized(
    graph: onnx.GraphProto, producers: dict[str, onnx.NodeProto]
) -> dict[str, tuple[list[onnx.NodeProto], str]]:
    """Compute node → (the QuantizeLinear nodes on the way, graph output) for each graph output the QDQ model
    returns dequantized, through shape plumbing, from one compute node."""
    found: dict[str, tuple[list[onnx.NodeProto], str]] = {}
    for output in graph.output:
        node, chain = producers.get(output.name), []
        if node is None or node.op_type != "DequantizeLinear":
            continue
        while node is not None and (node.op_type in QDQ_OPS or node.op_type in CARRIES_SCALE) and node.input:
            chain += [node] if node.op_type == "QuantizeLinear" else []
            node = producers.get(node.input[0])
        if node is not None and chain:
            found[node.name] = (chain, output.name)
    return found


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    added = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n not in present]
    probe.graph.output.extend(added)
    return probe


def _group(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> tuple[str, ...]:
    """`node` and the nodes that share its activation inputs' quantization (see the module's docstring)."""
    group = [node.name]
    for tensor in node.input:
        current = producers.get(tensor)
        while current is not None and current.op_type in CARRIES_SCALE and current.input:
            group.append(current.name)
            current = producers.get(current.input[0])
        if current is not None and current.op_type not in QDQ_OPS:
            group.append(current.name)
    return tuple(dict.fromkeys(n for n in group if n))
