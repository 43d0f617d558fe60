"""Cutting a bundle file into content-defined chunks, and compressing each chunk where it pays (host side).

Boundaries follow the tar: every member's data starts and ends a chunk, and the bytes between members (tar and PAX
headers, padding) form chunks of their own. In an ONNX member each sizeable tensor's bytes start and end chunks (their
offsets read from the protobuf wire format, control/publish/onnx_spans.py), so a tensor that did not change keeps its
chunks even when the graph was re-serialized around it. Inside each such stretch, a hash of the last 8 bytes picks the
cuts (content-defined chunking, vectorized with numpy, about sha256's speed): a cut falls after a byte whose hash has
its top `bits` bits zero, at least `min_size` and at most `max_size` after the previous cut. Cuts depend only on nearby
content, so an unchanged file, and an unchanged stretch (a tensor) inside a changed ONNX file, map to the same chunks in
a new version: after a change the cuts fall back in step within a chunk or two.

Each chunk is zstd-compressed and kept compressed only when that saves more than `min_saving` of its size (float
weights barely compress; golden sets, JSON and int8 tensors often do).

The device never needs to cut anything: it learns the chunks from the signed offer and finds the ones it holds by their
position in the bundles it installed (agent/transfer/chunk_index.py), so these parameters are the host's to change.
"""

from __future__ import annotations

import hashlib
import itertools
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from edgefleet.control.publish.onnx_spans import NotOnnx, tensor_spans
from edgefleet.core.errors import BundleError
from edgefleet.core.messages import ChunkRef
from edgefleet.core.transfer.chunk_index import encode_pages, needs_index, page_refs

MIN_SIZE = 16 * 1024
ALIGN_MIN = 2 * 1024  # a tensor this big is chunked on its own (smaller ones ride with their neighbours)
BITS = 15  # a cut every 32 KiB on average past the minimum
WINDOW = 8  # bytes the rolling hash sees
ZSTD_LEVEL = 3
MIN_SAVING = 0.05
_SEGMENT = 64 << 10  # windows hashed at a time: the products stay in the CPU's cache (4x faster than 8 MiB)
SAMPLE = 2048  # bytes of each of a chunk's start, middle and end that zstd tries first
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: 2**64 / golden ratio


@dataclass(frozen=True)
class Piece:
    offset: int
    size: int


def window_hashes(data: memoryview, bits: int) -> np.ndarray:
    """For each 8-byte window of `data` (read in place as little-endian uint64), the top `bits` bits of its
    product with an odd 64-bit constant: every byte of the window moves them (one multiply a byte, vectorized)."""
    count = len(data) - WINDOW + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    windows = np.ndarray((count,), dtype="<u8", buffer=data, strides=(1,))
    return (windows * _MULTIPLIER) >> np.uint64(64 - bits)


def cut_candidates(data: memoryview, bits: int) -> np.ndarray:
    """Every offset just past a window whose hash (`window_hashes`) is zero, ascending. The same test as
    `window_hashes(...) == 0` (the top `bits` bits of the product are zero: it is below 2**(64 - bits)), one
    cache-sized segment at a time into one reused buffer, without the shift and its temporaries."""
    count = len(data) - WINDOW + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    below = np.uint64(1) << np.uint64(64 - bits)
    buffer = np.empty(min(count, _SEGMENT), dtype=np.uint64)
    found = []
    for start in range(0, count, _SEGMENT):
        length = min(_SEGMENT, count - start)
        windows = np.ndarray((length,), dtype="<u8", buffer=data, offset=start, strides=(1,))
        products = buffer[:length]
        np.multiply(windows, _MULTIPLIER, out=products)
        found.append(np.flatnonzero(products < below) + (start + WINDOW))  # cut after the window's last byte
    return np.concatenate(found)


def cut_region(data: memoryview, *, min_size: int = MIN_SIZE, bits: int = BITS, max_size: int) -> list[int]:
    """Chunk lengths for one region (a member's data, or a tensor), content-defined."""
    n = len(data)
    if n <= min_size:
        return [n] if n else []
    ends = cut_candidates(data, bits)
    sizes, at = [], 0
    while at < n:
        if n - at <= min_size:
            sizes.append(n - at)
            break
        i = int(np.searchsorted(ends, at + min_size))
        end = min(int(ends[i]) if i < len(ends) else n, at + max_size)
        sizes.append(end - at)
        at = end
    return sizes


def tar_regions(bundle: Path) -> list[tuple[int, int, str | None]]:
    """(offset, size, member name or None) covering the whole file: member data, and the bytes between."""
    regions: list[tuple[int, int, str | None]] = []
    at = 0
    try:
        with tarfile.open(bundle, "r:") as tar:
            for member in tar:
                if member.offset_data > at:
                    regions.append((at, member.offset_data - at, None))
                if member.size:
                    regions.append((member.offset_data, member.size, member.name))
                at = member.offset_data + member.size
    except (tarfile.TarError, OSError) as err:
        raise BundleError(f"{bundle.name} is truncated or corrupt: {err}") from err
    total = bundle.stat().st_size
    if total > at:
        regions.append((at, total - at, None))
    return regions


def plan_chunks(
    bundle: Path, max_size: int, *, min_size: int = MIN_SIZE, bits: int = BITS, align_tensors: bool = True
) -> list[Piece]:
    """The chunks of a bundle file, in order, covering every byte once. In an ONNX member, each tensor of at
    least ALIGN_MIN bytes starts and ends chunks (`align_tensors`); content-defined cuts fall in between."""
    return [
        piece for piece, _ in iter_chunks(bundle, max_size, min_size=min_size, bits=bits, align_tensors=align_tensors)
    ]


def iter_chunks(
    bundle: Path, max_size: int, *, min_size: int = MIN_SIZE, bits: int = BITS, align_tensors: bool = True
) -> Iterator[tuple[Piece, memoryview]]:
    """`plan_chunks` with each chunk's bytes, read once (a member's data is read whole to be cut anyway)."""
    min_size = min(min_size, max_size // 2)  # small messages (a broker's limit) make small chunks
    with bundle.open("rb") as handle:
        for offset, size, name in tar_regions(bundle):
            handle.seek(offset)
            data = memoryview(handle.read(size))
            if len(data) != size:
                raise BundleError(f"{bundle.name} changed while it was cut")
            if name is None:
                for piece in _fixed(offset, size, max_size):
                    yield piece, data[piece.offset - offset : piece.offset - offset + piece.size]
                continue
            cuts = tensor_cuts(data, ALIGN_MIN) if align_tensors and name.endswith(".onnx") else []
            for start, end in itertools.pairwise([0, *cuts, size]):
                at = start
                for length in cut_region(data[start:end], min_size=min_size, bits=bits, max_size=max_size):
                    yield Piece(offset + at, length), data[at : at + length]
                    at += length


def describe_chunks(bundle: Path, max_size: int, *, min_saving: float = MIN_SAVING) -> list[ChunkRef]:
    """The chunk list `publish` signs for a bundle none of whose chunks is on the broker yet (nothing published)."""
    refs = []
    for _, data in iter_chunks(bundle, max_size):
        frame = encode(data, min_saving=min_saving)
        refs.append(ChunkRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                             zstd=len(frame) if frame is not None else None))  # fmt: skip
    return refs


def chunk_names(bundle: Path, max_size: int) -> list[str]:
    """The names (sha256) of the chunks a device fetches for a bundle as `publish` will cut it, its index pages
    included (core/transfer/chunk_index.py): what an `acl_file` lists."""
    refs = describe_chunks(bundle, max_size)
    pages = page_refs(encode_pages(refs, max_size)) if needs_index(refs) else []
    return [ref.sha256 for ref in [*refs, *pages]]


def tensor_cuts(model: memoryview, min_size: int) -> list[int]:
    """Where each tensor of at least `min_size` bytes starts and ends in a serialized ONNX model (cut points: its
    payload is chunked on its own, apart from the headers and graph around it), or none when the bytes are not a
    model this reader can walk."""
    try:
        spans = tensor_spans(model, min_size)
    except NotOnnx:
        return []
    return sorted({cut for span in spans for cut in span} - {0, len(model)})


def _fixed(offset: int, size: int, max_size: int) -> Iterator[Piece]:
    for start in range(offset, offset + size, max_size):
        yield Piece(start, min(max_size, offset + size - start))


def encode(data: bytes | memoryview, *, level: int = ZSTD_LEVEL, min_saving: float = MIN_SAVING) -> bytes | None:
    """The zstd frame of `data` when it saves more than `min_saving` of its size, else None (sent raw).

    A chunk much bigger than the sample is first judged by its start, middle and end (3 x SAMPLE bytes): when those
    save less than half of `min_saving`, the chunk travels raw without compressing the rest (float weights and
    random bytes, most of a bundle, cost a sample instead of a whole compression). Raw is always a valid choice.
    """
    compressor = _compressor(level)
    if len(data) >= 8 * SAMPLE:
        middle = (len(data) - SAMPLE) // 2
        sample = b"".join([data[:SAMPLE], data[middle : middle + SAMPLE], data[-SAMPLE:]])
        if len(compressor.compress(sample)) >= len(sample) * (1.0 - min_saving / 2):
            return None
    frame = compressor.compress(data)
    return frame if len(frame) < len(data) * (1.0 - min_saving) else None


_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """One compressor per thread and level (creating one per chunk costs more than compressing a sample)."""
    cache: dict[int, zstandard.ZstdCompressor] = _local.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


__all__ = [
    "MIN_SAVING",
    "Piece",
    "chunk_names",
    "cut_candidates",
    "cut_region",
    "describe_chunks",
    "encode",
    "iter_chunks",
    "plan_chunks",
    "tar_regions",
    "window_hashes",
]
