"""String inputs (ONNX `tensor(string)`, e.g. a skl2onnx pipeline's categorical column) on the local API.

OIP v2 carries them as `BYTES`: in JSON a (flat or nested) list of strings, in binary each element as a 4-byte
little-endian length and its bytes, back to back (the KServe v2 binary extension, as Triton's client writes
them). /v1 takes them as JSON with dtype "str". Every check runs before anything is allocated for the elements:

- the element count is the shape's product, and the data must hold exactly that many strings;
- each element is at most `MAX_ELEMENT_BYTES` bytes of UTF-8 (the runtimes take text), the whole at most `limit`;
- a binary tensor's lengths must tile its `binary_data_size` exactly.

A bad request is a 400 (or a 413 over the limit) with the reason: the caller's fault, never the model's failure.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgefleet.agent.api.body_guard import bad, element_count
from edgefleet.agent.api.errors import RequestError
from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.tensors import is_string_dtype

MAX_ELEMENT_BYTES = 64 * 1024
_LENGTH = struct.Struct("<I")


def takes_text(spec: TensorSpec | None) -> bool:
    return spec is not None and is_string_dtype(spec.dtype)


def check_text_shape(name: str, shape: Sequence[int], spec: TensorSpec | None) -> int:
    """Rank and fixed dimensions as for any input; returns the element count."""
    if spec is not None:
        if len(shape) != len(spec.shape):
            raise bad(f"input {name!r} has rank {len(shape)}; the model takes {spec.shape}")
        for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
            if isinstance(want, int) and want >= 0 and got != want:
                raise bad(f"input {name!r}: dimension {axis} is {got}, the model takes {want} (shape {spec.shape})")
    return element_count(shape)


def _too_large(name: str, size: int, limit: int) -> RequestError:
    return RequestError(413, "too-large", f"input {name!r} holds {size} bytes of strings; the limit is {limit} bytes")


def _element(name: str, index: int, raw: bytes | memoryview) -> str:
    if len(raw) > MAX_ELEMENT_BYTES:
        raise bad(f"input {name!r}: element {index} is {len(raw)} bytes; the limit is {MAX_ELEMENT_BYTES} per string")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad(f"input {name!r}: element {index} is not UTF-8 text: {err}") from err


def text_from_binary(name: str, shape: list[int], blob: memoryview, limit: int) -> np.ndarray:
    """A binary BYTES tensor: `count` length-prefixed elements that fill `blob` exactly."""
    count = element_count(shape)
    if len(blob) > limit:
        raise _too_large(name, len(blob), limit)
    if count * _LENGTH.size > len(blob):  # every element needs its 4-byte length: checked before any allocation
        raise bad(
            f"input {name!r}: {len(blob)} bytes cannot hold {count} length-prefixed strings (shape {list(shape)})"
        )
    values: list[str] = []
    offset = 0
    for index in range(count):
        if offset + _LENGTH.size > len(blob):
            raise bad(f"input {name!r}: the data ends before element {index} of {count} (shape {list(shape)})")
        (length,) = _LENGTH.unpack_from(blob, offset)
        offset += _LENGTH.size
        if length > MAX_ELEMENT_BYTES:
            raise bad(f"input {name!r}: element {index} is {length} bytes; the limit is {MAX_ELEMENT_BYTES} per string")
        if offset + length > len(blob):
            raise bad(f"input {name!r}: element {index} declares {length} bytes; only {len(blob) - offset} are left")
        values.append(_element(name, index, blob[offset : offset + length]))
        offset += length
    if offset != len(blob):
        raise bad(
            f"input {name!r}: {len(blob) - offset} bytes are left after its {count} strings (shape {list(shape)})"
        )
    return _shaped(values, shape)


def text_from_json(name: str, shape: list[int], data: Any, limit: int) -> np.ndarray:
    """JSON BYTES data: strings, flat or nested as the shape; exactly the shape's element count."""
    count = element_count(shape)
    values: list[str] = []
    total = 0
    stack = [data] if isinstance(data, list) else None
    if stack is None:
        raise bad(f"input {name!r}: BYTES data must be a list of strings")
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
            continue
        if not isinstance(item, str):
            raise bad(f"input {name!r}: BYTES data holds a {type(item).__name__}; every element must be a string")
        try:
            raw = item.encode("utf-8")
        except UnicodeEncodeError as err:
            raise bad(f"input {name!r}: element {len(values)} is not UTF-8 text: {err}") from err
        total += len(raw)
        if total > limit:
            raise _too_large(name, total, limit)
        values.append(_element(name, len(values), raw))
        if len(values) > count:
            break
    if len(values) != count:
        held = f"more than {count}" if len(values) > count else str(len(values))
        raise bad(f"input {name!r}: data holds {held} strings, shape {list(shape)} needs {count}")
    return _shaped(values, shape)


def _shaped(values: list[str], shape: Sequence[int]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(tuple(shape))


def text_from_array(name: str, array: np.ndarray, limit: int) -> np.ndarray:
    """A text tensor that arrived as a numpy array (MQTT's WireTensor: fixed-width unicode, or UTF-8 bytes) as the
    runtimes take it: an object array of str, with the same checks as a BYTES tensor (every element valid text of at
    most `MAX_ELEMENT_BYTES` bytes of UTF-8, the whole at most `limit`). Other kinds are returned as they are (the
    model's own check says what it takes)."""
    if array.dtype.kind not in "US":
        return array
    if array.nbytes > 4 * limit:  # bounds what making the str objects allocates (UTF-32: 4 bytes a code point)
        raise _too_large(name, array.nbytes, limit)
    try:
        items = array.ravel().tolist()
    except (ValueError, SystemError) as err:  # a code point beyond U+10FFFF: no str can hold it (CPython: SystemError)
        raise bad(f"input {name!r} holds code points that are not text: {err}") from err
    values: list[str] = []
    total = 0
    for index, item in enumerate(items):
        if isinstance(item, bytes):
            raw: bytes = item
        else:
            try:
                raw = item.encode("utf-8")
            except UnicodeEncodeError as err:  # a lone surrogate
                raise bad(f"input {name!r}: element {index} is not text (no UTF-8 for it): {err.reason}") from err
        total += len(raw)
        if total > limit:
            raise _too_large(name, total, limit)
        values.append(_element(name, index, raw))
    return _shaped(values, array.shape)
