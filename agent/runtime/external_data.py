"""The external-data files an ONNX model names, read from the protobuf wire format without loading a weight.

ONNX keeps large tensors outside the model file: a tensor whose `data_location` is EXTERNAL names a `location`
(relative to the model file's folder), an `offset` and a `length`. ONNX Runtime and OpenVINO open those files when
they load the model. To know which files a load would open before any runtime sees the model, this walks the
ModelProto's messages that can hold tensors (the graph and every subgraph in node attributes, initializers, sparse
initializers, functions, training graphs) and reads each tensor's external-data entries; tensor bytes are skipped
by their length, never copied, so a model of any size costs a pass over its message headers. It needs neither the
`onnx` package (devices do not install it) nor a runtime.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

from edgefleet.core.errors import BundleError

# Field numbers (onnx/onnx.proto) of the messages that can hold a TensorProto, and what each field holds.
_MODEL = {7: "graph", 20: "training", 25: "function"}
_TRAINING = {1: "graph", 2: "graph"}
_FUNCTION = {7: "node", 11: "attribute"}
_GRAPH = {1: "node", 5: "tensor", 15: "sparse"}
_NODE = {5: "attribute"}
_ATTRIBUTE = {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"}
_SPARSE = {1: "tensor", 2: "tensor"}
_SCHEMA = {
    "model": _MODEL,
    "training": _TRAINING,
    "function": _FUNCTION,
    "graph": _GRAPH,
    "node": _NODE,
    "attribute": _ATTRIBUTE,
    "sparse": _SPARSE,
}
_TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 8, 13, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
MAX_DEPTH = 64  # subgraphs nested deeper than any real model


@dataclass(frozen=True)
class ExternalData:
    """One tensor's bytes outside the model file, as the model names them."""

    tensor: str
    location: str
    offset: int
    length: int | None


class _Malformed(Exception):
    pass


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed("a truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview, start: int, end: int):  # type: ignore[no-untyped-def]
    """(field number, wire type, value or (start, end)) of each field in buf[start:end]."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise _Malformed(f"field {number} runs past the end of its message")
            yield number, wire, (pos, pos + size)
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise _Malformed(f"field {number} has wire type {wire} (groups are not ONNX)")
        if pos > end:
            raise _Malformed(f"field {number} runs past the end of its message")


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    try:
        return bytes(buf[span[0] : span[1]]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise _Malformed("a string that is not UTF-8") from err


def _tensor(buf: memoryview, start: int, end: int) -> ExternalData | None:
    name, external, location = "", False, False
    entries: dict[str, str] = {}
    for number, wire, value in _fields(buf, start, end):
        if number == _TENSOR_NAME and wire == 2:
            name = _text(buf, value)
        elif number == _TENSOR_LOCATION and wire == 0:
            external = value == _EXTERNAL
        elif number == _TENSOR_EXTERNAL and wire == 2:
            key = val = ""
            for inner, inner_wire, span in _fields(buf, *value):
                if inner_wire == 2 and inner == 1:
                    key = _text(buf, span)
                elif inner_wire == 2 and inner == 2:
                    val = _text(buf, span)
            entries[key] = val
            location = location or key == "location"
    if not (external or location):
        return None
    if "location" not in entries:
        raise _Malformed(f"tensor {name!r} is stored externally but names no location")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError as err:
        raise _Malformed(f"tensor {name!r} has a non-numeric external-data offset or length") from err
    if offset < 0 or (length is not None and length < 0):
        raise _Malformed(f"tensor {name!r} has a negative external-data offset or length")
    return ExternalData(name, entries["location"], offset, length)


def _walk(buf: memoryview, kind: str, start: int, end: int, depth: int, found: list[ExternalData]) -> None:
    if depth > MAX_DEPTH:
        raise _Malformed(f"subgraphs nested more than {MAX_DEPTH} deep")
    schema = _SCHEMA[kind]
    for number, wire, value in _fields(buf, start, end):
        inner = schema.get(number)
        if inner is None or wire != 2:
            continue
        if inner == "tensor":
            entry = _tensor(buf, *value)
            if entry is not None:
                found.append(entry)
        else:
            _walk(buf, inner, value[0], value[1], depth + 1, found)


def external_data(model_file: Path) -> list[ExternalData]:
    """Every external-data reference in the ONNX model at `model_file`; BundleError when it is not a readable ONNX
    protobuf."""
    try:
        with model_file.open("rb") as handle:
            if model_file.stat().st_size == 0:
                raise BundleError(f"{model_file.name} is empty, not an ONNX model")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                buf = memoryview(mapped)
                try:
                    found: list[ExternalData] = []
                    _walk(buf, "model", 0, len(buf), 0, found)
                    return found
                finally:
                    buf.release()
    except _Malformed as err:
        raise BundleError(f"{model_file.name} is not a well-formed ONNX model: {err}") from err
    except OSError as err:
        raise BundleError(f"cannot read {model_file.name}: {err}") from err


__all__ = ["ExternalData", "external_data"]
