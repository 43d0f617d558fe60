"""Where the tensors' bytes lie inside a serialized ONNX model, read straight from the protobuf wire format.

The chunker (control/publish/chunker.py) starts and ends a chunk at each sizeable tensor, so a tensor that did not
change maps to the same chunks even when the graph around it was rewritten, its tensors reordered, or a Constant node
became an initializer. Only the wire format is read (no `onnx` import, no copy of the model): ModelProto.graph (7) ->
GraphProto.initializer (5) and node (1) -> NodeProto.attribute (5) -> AttributeProto.t (5), tensors (10), g (6), graphs
(11), into subgraphs; a TensorProto's raw_data (9) or packed numeric data (4, 5, 7, 10, 11).
"""

from __future__ import annotations

from collections.abc import Iterator

_TENSOR_DATA = {4, 5, 7, 9, 10, 11}  # float, int32, int64, raw, double, uint64 data
_MAX_DEPTH = 16


class NotOnnx(ValueError):
    """The bytes are not a protobuf this reader can walk (the chunker then cuts by content alone)."""


def tensor_spans(data: bytes | memoryview, min_size: int) -> list[tuple[int, int]]:
    """(start, end) of every tensor payload of at least `min_size` bytes, sorted, non-overlapping."""
    view = memoryview(data)
    spans = sorted(s for s in _model(view, 0, len(view)) if s[1] - s[0] >= min_size)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start < merged[-1][1]:
            raise NotOnnx("overlapping tensor payloads")
        merged.append((start, end))
    return merged


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= end or shift > 63:
            raise NotOnnx("truncated varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field; other wire types are skipped."""
    i = start
    while i < end:
        key, i = _varint(buf, i, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i, end)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = _varint(buf, i, end)
            if i + length > end:
                raise NotOnnx("a field runs past its message")
            yield number, i, i + length
            i += length
        else:
            raise NotOnnx(f"wire type {wire} is not used by ONNX")
    if i != end:
        raise NotOnnx("a message runs past its end")


def _model(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int]]:
    for number, s, e in _fields(buf, start, end):
        if number == 7:
            yield from _graph(buf, s, e, 0)


def _graph(buf: memoryview, start: int, end: int, depth: int) -> Iterator[tuple[int, int]]:
    if depth > _MAX_DEPTH:
        raise NotOnnx("subgraphs nested too deep")
    for number, s, e in _fields(buf, start, end):
        if number == 5:
            yield from _tensor(buf, s, e)
        elif number == 1:
            for field, a, b in _fields(buf, s, e):
                if field == 5:
                    yield from _attribute(buf, a, b, depth)


def _attribute(buf: memoryview, start: int, end: int, depth: int) -> Iterator[tuple[int, int]]:
    for number, s, e in _fields(buf, start, end):
        if number in (5, 10):
            yield from _tensor(buf, s, e)
        elif number in (6, 11):
            yield from _graph(buf, s, e, depth + 1)


def _tensor(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int]]:
    for number, s, e in _fields(buf, start, end):
        if number in _TENSOR_DATA:
            yield s, e


__all__ = ["NotOnnx", "tensor_spans"]
