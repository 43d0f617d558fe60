"""Checks that run on request bodies BEFORE anything is parsed, allocated or decompressed.

- JSON: the nesting depth is measured on the raw bytes (strings skipped) and refused beyond `MAX_JSON_DEPTH`,
  so the parser never recurses deep; a RecursionError that still escapes is a 400 too.
- Tensor sizes: element counts are computed with Python integers (numpy's int64 product wraps around) and
  checked against the bytes the body really carries, so a shape cannot make the agent allocate.
- .npz: each member's declared size and its .npy header (dtype, shape) are checked against the model's input
  before a byte of it is decompressed; reading is bounded by that declared size.

Every refusal is a RequestError (400 or 413): the caller's fault, never a failure of the model.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from edgefleet.agent.api.errors import RequestError
from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.tensors import is_string_dtype

T = TypeVar("T")
MAX_JSON_DEPTH = 32
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STEP = np.zeros(256, np.int32)  # +1 for [ and {, -1 for ] and }
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_NPY_HEADER_SLACK = 4096  # the .npy magic and header in front of the data


def bad(message: str) -> RequestError:
    return RequestError(400, "bad-request", message)


def decode_guarded(decode: Callable[[], T]) -> T:
    """Run a body decoder; whatever it raises is the caller's input error, never the model's failure."""
    try:
        return decode()
    except RequestError:
        raise
    except MemoryError as err:
        raise RequestError(413, "too-large", "the request does not fit in memory") from err
    except Exception as err:
        raise RequestError(400, "bad-request", f"body could not be decoded: {type(err).__name__}: {err}") from err


def json_depth(body: bytes | bytearray | memoryview) -> int:
    """Deepest nesting of [ and { outside strings (a well-formed document's exact depth)."""
    raw = bytes(body)
    opened = raw.count(b"[") + raw.count(b"{")
    if opened <= 1:
        return opened
    if b'"' in raw:
        raw = _STRINGS.sub(b'""', raw)
    steps = _STEP[np.frombuffer(raw, np.uint8)]
    return int(np.cumsum(steps).max())


def _depth_at_most(body: bytes | bytearray | memoryview, limit: int) -> bool:
    """Cheap first: a document with at most `limit` opening brackets cannot nest deeper."""
    raw = bytes(body)
    return raw.count(b"[") + raw.count(b"{") <= limit


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON (a JSON number is finite)")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)  # one decoder: json.loads(..., kw) builds one per call


def load_json(body: bytes | bytearray | memoryview, limit: int = MAX_JSON_DEPTH) -> Any:
    """Parse a JSON body whose nesting was checked first; every failure is a 400."""
    if not _depth_at_most(body, limit) and (depth := json_depth(body)) > limit:
        raise bad(f"JSON nested {depth} deep; the limit is {limit}")
    try:
        return _STRICT.decode(bytes(body).decode("utf-8"))  # JSON is UTF-8 (RFC 8259 §8.1)
    except RecursionError as err:
        raise bad("JSON nested too deep") from err
    except (ValueError, UnicodeDecodeError) as err:
        raise bad(f"body is not valid JSON: {err}") from err


def element_count(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def spec_for(specs: Sequence[TensorSpec], name: str) -> TensorSpec | None:
    return next((spec for spec in specs if spec.name == name), None)


def max_bytes_for(spec: TensorSpec | None, dtype: np.dtype[Any], limit: int) -> int:
    """The most bytes an input may decode to: its exact size when every dimension is fixed, else `limit`."""
    if spec is not None and all(isinstance(d, int) for d in spec.shape) and not is_string_dtype(spec.dtype):
        return min(limit, element_count([int(d) for d in spec.shape if isinstance(d, int)]) * dtype.itemsize)
    return limit


def check_shape(name: str, shape: Sequence[int], dtype: np.dtype[Any], spec: TensorSpec | None, limit: int) -> int:
    """Refuse a shape that cannot be this input (rank, fixed dimensions, size); returns its byte size."""
    if spec is not None:
        if len(shape) != len(spec.shape):
            raise bad(f"input {name!r} has rank {len(shape)}; the model takes {spec.shape}")
        for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
            if isinstance(want, int) and got != want:
                raise bad(f"input {name!r}: dimension {axis} is {got}, the model takes {want} (shape {spec.shape})")
    nbytes = element_count(shape) * dtype.itemsize
    if nbytes > limit:
        raise RequestError(413, "too-large", f"input {name!r} of shape {list(shape)} is {nbytes} bytes; "
                           f"the limit is {limit} bytes")  # fmt: skip
    return nbytes


def read_npz(body: bytes, specs: Sequence[TensorSpec], limit: int) -> dict[str, np.ndarray]:
    """The arrays of an .npz body, each checked (declared size, then .npy header) before it is decompressed."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise bad(f"body is not a readable .npz: {err}") from err
    with archive:
        members = archive.infolist()
        if len(members) > max(len(specs), 1):
            raise bad(f".npz holds {len(members)} members; the model takes {len(specs)} inputs")
        feeds: dict[str, np.ndarray] = {}
        total = 0
        for info in members:
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            spec = spec_for(specs, name)
            if spec is None:
                raise bad(f".npz member {info.filename!r} is not an input of the model ({[s.name for s in specs]})")
            dtype = np.dtype(spec.dtype)
            allowed = max_bytes_for(spec, dtype, limit) + _NPY_HEADER_SLACK
            if info.file_size > allowed:
                raise RequestError(413, "too-large", f".npz member {info.filename!r} unpacks to {info.file_size} "
                                   f"bytes; input {name!r} needs at most {allowed}")  # fmt: skip
            total += info.file_size
            if total > limit + _NPY_HEADER_SLACK * len(members):
                raise RequestError(413, "too-large", f".npz unpacks to more than the limit of {limit} bytes")
            feeds[name] = _read_member(archive, info, name, spec, limit)
    return feeds


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, spec: TensorSpec, limit: int) -> Any:
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise bad(f".npz member {info.filename!r}: .npy version {version} is not accepted")
            if dtype.hasobject:
                raise bad("object arrays are not accepted (they would need pickles)")
            nbytes = check_shape(name, shape, dtype, spec, limit)
            header = member.tell()
            if header + nbytes != info.file_size:
                raise bad(f".npz member {info.filename!r}: shape {list(shape)} does not match its size")
            data = member.read(nbytes)
    except RequestError:
        raise
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, NotImplementedError) as err:
        raise bad(f".npz member {info.filename!r} is not readable: {err}") from err
    if len(data) != nbytes:
        raise bad(f".npz member {info.filename!r} is truncated")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array
