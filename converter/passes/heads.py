"""The nodes of a model's head: what a quantized detector keeps in float when its head breaks.

Walks back from the given outputs through their producers, at most `depth` compute nodes deep (shape plumbing
such as Reshape, Concat, Transpose is crossed without counting). Names come as ONNX node names and output tensor
names: ONNX Runtime excludes by node name, OpenVINO names converted operations after their output tensors.
"""

from __future__ import annotations

import onnx

PLUMBING = frozenset(
    {"Reshape", "Concat", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Split", "Slice", "Gather",
     "Shape", "Cast", "Expand"}
)  # fmt: skip


def head_nodes(model: onnx.ModelProto, outputs: list[str], depth: int = 3) -> list[str]:
    producers = {out: node for node in model.graph.node for out in node.output}
    names: list[str] = []
    frontier = [(name, 0) for name in outputs]
    seen: set[str] = set()
    while frontier:
        tensor, level = frontier.pop()
        node = producers.get(tensor)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))  # type: ignore[arg-type]
        compute = node.op_type not in PLUMBING
        if compute:
            names.extend(n for n in (node.name, node.output[0]) if n)
        next_level = level + (1 if compute else 0)
        if next_level < depth:
            frontier.extend((inp, next_level) for inp in node.input if inp)
    return list(dict.fromkeys(names))
