"""String outputs (class names, e.g. skl2onnx's `output_label`) on the local API.

Runtimes return them as object arrays of str, which neither .npy/.npz (no pickles) nor raw tensor bytes can
carry: they are answered as unicode arrays in .npz/.npy, as JSON strings on /v1, and as OIP `BYTES` on /v2
(JSON strings, or in binary each element as a 4-byte little-endian length and its UTF-8 bytes, as Triton does).
"""

from __future__ import annotations

import struct

import numpy as np

BYTES = "BYTES"


def is_text(array: np.ndarray) -> bool:
    return array.dtype.kind in "OUS"


def as_unicode(array: np.ndarray) -> np.ndarray:
    """A text output as a unicode array (savable without pickles); any other output unchanged."""
    if array.dtype.kind == "O":
        return array.astype(str)
    if array.dtype.kind == "S":
        return np.char.decode(array, "utf-8")
    return array


def text_list(array: np.ndarray) -> list[object]:
    """A text output's values, flattened, as JSON strings."""
    return [str(v) for v in as_unicode(array).ravel().tolist()]


def bytes_blob(array: np.ndarray) -> bytes:
    """OIP's binary form of a BYTES tensor: per element, its length (uint32 little-endian) and its bytes."""
    parts: list[bytes] = []
    for value in as_unicode(array).ravel().tolist():
        data = str(value).encode()
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)
