"""Request and answer bodies of the local inference API: JSON tensors, .npy and .npz (never unpickled)."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgefleet.agent.api.body_guard import element_count, load_json, read_npz
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.finite import check_json_output
from edgefleet.agent.api.label_outputs import as_unicode, is_text
from edgefleet.agent.api.string_inputs import text_from_json
from edgefleet.core.bundle.manifest import Manifest

log = logging.getLogger(__name__)

JSON, NPZ, NPY = "application/json", "application/x-npz", "application/x-npy"
_DTYPE_KINDS = "biuf"  # bool, signed, unsigned, float: what a model input can be


@dataclass(frozen=True)
class Decoded:
    feeds: dict[str, np.ndarray]
    format: str  # JSON, NPZ or NPY


def decode_body(body: bytes, content_type: str, manifest: Manifest, limit: int = 64 * 2**20) -> Decoded:
    """Request body → input arrays (names, dtypes and shapes are checked later by the model).

    `limit` bounds the bytes any input may decode to; .npz members are checked before decompression.
    """
    kind = content_type.split(";", 1)[0].strip().lower() or JSON
    if kind == JSON:
        return Decoded(_decode_json(body, limit), JSON)
    if kind == NPZ:
        return Decoded(read_npz(body, manifest.inputs, limit), NPZ)
    if kind == NPY:
        if len(manifest.inputs) != 1:
            names = [spec.name for spec in manifest.inputs]
            raise RequestError(
                400, "bad-request", f"a .npy body fits single-input models only; this one takes {names}: send .npz"
            )
        return Decoded({manifest.inputs[0].name: load_npy(body)}, NPY)
    raise RequestError(415, "bad-request", f"content type {kind!r} is not accepted; use {JSON}, {NPZ} or {NPY}")


def _decode_json(body: bytes, limit: int) -> dict[str, np.ndarray]:
    document = load_json(body)
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, dict):
        raise RequestError(400, "bad-request", 'JSON body must be {"inputs": {name: {"dtype", "shape", "data"}}}')
    return {str(name): _json_tensor(str(name), value, limit) for name, value in inputs.items()}


def _json_tensor(name: str, value: Any, limit: int) -> np.ndarray:
    if not isinstance(value, dict) or not {"dtype", "shape", "data"} <= set(value):
        raise RequestError(400, "bad-request", f"input {name!r} must be an object with dtype, shape and data")
    try:
        dtype = np.dtype(value["dtype"])
    except (TypeError, ValueError) as err:
        raise RequestError(400, "bad-request", f"input {name!r}: unknown dtype {value['dtype']!r}") from err
    if dtype.kind not in _DTYPE_KINDS and value["dtype"] != "str":
        raise RequestError(400, "bad-request", f"input {name!r}: dtype {dtype} is not a numeric or bool dtype "
                           '(string inputs are dtype "str")')  # fmt: skip
    shape = value["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise RequestError(400, "bad-request", f"input {name!r}: shape must be a list of non-negative integers")
    if value["dtype"] == "str":  # a string input: a list of strings, checked like OIP's BYTES
        return text_from_json(name, shape, value["data"], limit)
    try:
        array = np.array(value["data"], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise RequestError(400, "bad-request", f"input {name!r}: data does not convert to {dtype}: {err}") from err
    if list(array.shape) != shape:
        if array.size != element_count(shape):
            raise RequestError(
                400, "bad-request", f"input {name!r}: data holds {array.size} values, shape {shape} needs "
                f"{element_count(shape)}"
            )  # fmt: skip
        array = array.reshape(shape)  # flat data of the right size is accepted
    return array


def tensor_json(name: str, array: np.ndarray) -> dict[str, Any]:
    if is_text(array):  # class names: JSON strings, dtype "str"
        return {"dtype": "str", "shape": list(array.shape), "data": as_unicode(array).tolist()}
    check_json_output(name, array, f"ask for {NPY} or {NPZ} (Accept)")
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": array.tolist()}


_NPY_IN: dict[bytes, tuple[np.dtype[Any], tuple[int, ...]]] = {}  # .npy header -> (dtype, shape)
_NPY_OUT: dict[tuple[str, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> .npy header
_NPY_CACHE_SIZE = 256


def load_npy(body: bytes) -> np.ndarray:
    """A .npy body as a read-only array over the body, without pickles.

    Clients send the same dtype and shape again and again, so each distinct header is parsed once (numpy's
    own parser, which evaluates the header with `ast` and costs tens of microseconds) and then reused.
    """
    major = body[6] if len(body) > 10 and body[:6] == b"\x93NUMPY" else 0
    size = {1: 2, 2: 4}.get(major)
    if size is None:  # not .npy, or version 3: refused (numpy would allocate what the header says first)
        if body[:2] == b"PK":
            raise RequestError(400, "bad-request", "body is an .npz archive; send it as application/x-npz")
        raise RequestError(400, "bad-request", "body is not a readable .npy (versions 1 and 2 are accepted)")
    offset = 8 + size + int.from_bytes(body[8 : 8 + size], "little")
    header = body[:offset]
    parsed = _NPY_IN.get(header)
    if parsed is None:
        stream = io.BytesIO(body)
        try:
            np.lib.format.read_magic(stream)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(stream)
        except (ValueError, OSError, EOFError) as err:
            raise RequestError(400, "bad-request", f"body is not a readable .npy: {err}") from err
        if dtype.hasobject:
            raise RequestError(400, "bad-request", "object arrays are not accepted (they would need pickles)")
        if math.prod(shape) * dtype.itemsize > len(body) - offset:
            raise RequestError(400, "bad-request", f".npy body is truncated: shape {list(shape)} needs more data")
        if fortran:
            return _load_npy_slow(body)
        if len(_NPY_IN) >= _NPY_CACHE_SIZE:
            _NPY_IN.clear()
        parsed = _NPY_IN[header] = (dtype, tuple(shape))
    dtype, shape = parsed
    count = math.prod(shape)
    if len(body) - offset < count * dtype.itemsize:
        raise RequestError(400, "bad-request", f".npy body is truncated: shape {list(shape)} needs more data")
    return np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)


def _load_npy_slow(body: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError, MemoryError) as err:
        raise RequestError(400, "bad-request", f"body is not a readable .npy without pickles: {err}") from err
    if not isinstance(array, np.ndarray):
        raise RequestError(400, "bad-request", "body is an .npz archive; send it as application/x-npz")
    return array


def save_npy(array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array)
    key = (array.dtype.str, array.shape)
    header = _NPY_OUT.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        whole = buffer.getvalue()
        if len(_NPY_OUT) >= _NPY_CACHE_SIZE:
            _NPY_OUT.clear()
        header = _NPY_OUT[key] = whole[: len(whole) - array.nbytes]
    return header + array.tobytes()


def encode_outputs(outputs: Mapping[str, np.ndarray], kind: str) -> bytes:
    """.npy or .npz answers; string outputs as unicode arrays (object arrays would need pickles)."""
    if kind == NPY:
        return save_npy(as_unicode(next(iter(outputs.values()))))
    buffer = io.BytesIO()
    np.savez(buffer, **{k: as_unicode(v) for k, v in outputs.items()})  # type: ignore[arg-type]
    return buffer.getvalue()


def answer_format(accept: str, request_format: str, output_count: int) -> str:
    accepted = [part.split(";", 1)[0].strip().lower() for part in accept.split(",") if part.strip()]
    for kind in accepted:
        if kind in (JSON, NPZ) or (kind == NPY and output_count == 1):
            return kind
    if accepted and "*/*" not in accepted and "application/*" not in accepted:
        raise RequestError(406, "bad-request", f"cannot answer as {accept!r}; use {JSON}, {NPZ} or {NPY}")
    if request_format == NPY and output_count != 1:
        return NPZ
    return request_format
