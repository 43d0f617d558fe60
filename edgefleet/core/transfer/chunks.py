"""Content-addressed chunks of a bundle file: the layout rules and the one way a chunk's payload is decoded.

A chunked offer lists the bundle file as chunks in file order, each named by the sha256 of its uncompressed bytes
and retained on `{prefix}/chunks/{sha256}`. A chunk travels raw, or as one zstd frame when that saved enough on
the host (control/publish/chunker.py); the signed offer says which, and how many bytes each takes on the wire. A device
decodes a payload only within the signed sizes: a frame that would inflate past the chunk's signed size is refused
after reading at most one byte beyond it (a decompression bomb never reaches memory or disk), and the decoded bytes
must hash to the chunk's name. Since every chunk is checked on its own against the signed list (and the assembled
file unpacked against the signed manifest), a chunk from anywhere (an installed bundle, the broker) is as good as any
other.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator

import zstandard

from edgefleet.core.errors import BundleError
from edgefleet.core.messages import BundleOffer, ChunkRef, Transfer
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.chunk_index import expand

_MAX_DECODE_STEP = 1 << 16


class ChunkError(BundleError):
    """A chunk payload that is not the signed chunk (wrong length, hash, or a frame that inflates too far)."""


def chunk_offsets(transfer: Transfer) -> list[int]:
    """Where each chunk starts in the assembled file."""
    offsets, at = [], 0
    for ref in transfer.chunks:
        offsets.append(at)
        at += ref.size
    return offsets


def layout_problem(transfer: Transfer) -> str | None:
    """Why a chunked layout is impossible, or None: the sizes add up to the file, no chunk (raw or on the wire)
    exceeds `block_size`, and a compressed chunk is smaller on the wire than raw (else it would travel raw)."""
    total = sum(ref.size for ref in transfer.chunks)
    if total != transfer.size:
        return f"chunks add up to {total} bytes; the file is {transfer.size}"
    if transfer.block_sha256:
        return "an offer lists either blocks or chunks, not both"
    for index, ref in enumerate(transfer.chunks):
        if ref.size > transfer.block_size:
            return f"chunk {index} is {ref.size} bytes; chunks are at most {transfer.block_size}"
        if ref.zstd is not None and ref.zstd >= ref.size:
            return f"chunk {index} is no smaller compressed ({ref.zstd} of {ref.size} bytes)"
    return None


def wire_size(ref: ChunkRef) -> int:
    return ref.zstd if ref.zstd is not None else ref.size


def decode_chunk(ref: ChunkRef, payload: bytes) -> bytes:
    """The chunk's bytes from its payload, checked against the signed ref; ChunkError otherwise."""
    if len(payload) != wire_size(ref):
        raise ChunkError(f"chunk {ref.sha256[:12]}: {len(payload)} bytes on the wire, the offer says {wire_size(ref)}")
    data = payload if ref.zstd is None else inflate_bounded(payload, ref.size)
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ChunkError(f"chunk {ref.sha256[:12]} does not hash to its name")
    return data


def inflate_bounded(frame: bytes, limit: int) -> bytes:
    """Decompress one zstd frame, refusing it as soon as it yields more than `limit` bytes (never allocating for
    what the frame header claims)."""
    out = io.BytesIO()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(frame), read_across_frames=False) as reader:
            while piece := reader.read(min(_MAX_DECODE_STEP, limit + 1 - out.tell())):
                out.write(piece)
                if out.tell() > limit:
                    raise ChunkError(f"a zstd chunk inflates past its signed {limit} bytes (refused as a bomb)")
    except zstandard.ZstdError as err:
        raise ChunkError(f"a chunk is not a valid zstd frame: {err}") from err
    return out.getvalue()


def unique_chunks(transfer: Transfer) -> Iterator[tuple[ChunkRef, list[int]]]:
    """Each distinct chunk once, with every index where the file holds it (a file may repeat a chunk)."""
    where: dict[str, list[int]] = {}
    refs: dict[str, ChunkRef] = {}
    for index, ref in enumerate(transfer.chunks):
        where.setdefault(ref.sha256, []).append(index)
        refs.setdefault(ref.sha256, ref)
    for sha, indices in where.items():
        yield refs[sha], indices


def piece_topics(topics: Topics, offer: BundleOffer) -> list[str]:
    """The topic of each piece a device fetches: every block, each distinct chunk once (in file order), or for an
    offer whose chunk list is on index pages (core/transfer/chunk_index.py), each distinct page (`with_pages_read`
    next)."""
    if offer.transfer.chunks:
        return [topics.chunk(ref.sha256) for ref, _ in unique_chunks(offer.transfer)]
    if offer.transfer.index:
        return [topics.chunk(ref.sha256) for ref in _unique_pages(offer.transfer)]
    return [topics.bundle_block(offer.bundle_id, i) for i in range(offer.transfer.block_count)]


def piece_ok(transfer: Transfer, index: int, payload: bytes) -> bool:
    """Whether `payload` is piece `index` of `piece_topics` (a chunk or page is decoded within its signed sizes)."""
    if not transfer.chunks and not transfer.index:
        return hashlib.sha256(payload).hexdigest() == transfer.block_sha256[index]
    if transfer.chunks:
        ref = next(ref for i, (ref, _) in enumerate(unique_chunks(transfer)) if i == index)
    else:
        ref = _unique_pages(transfer)[index]
    try:
        decode_chunk(ref, payload)
    except ChunkError:
        return False
    return True


def with_pages_read(offer: BundleOffer, pages: dict[int, bytes]) -> BundleOffer:
    """The offer with its chunk list read from its pages, by piece index of `piece_topics` (each checked by
    `piece_ok`); ValueError for an entry no chunk can have."""
    unique = [ref.sha256 for ref in _unique_pages(offer.transfer)]
    ordered = [pages[unique.index(ref.sha256)] for ref in offer.transfer.index]
    return offer.model_copy(update={"transfer": expand(offer.transfer, ordered)})


def _unique_pages(transfer: Transfer) -> list[ChunkRef]:
    return list({ref.sha256: ref for ref in transfer.index}.values())


__all__ = [
    "ChunkError",
    "chunk_offsets",
    "decode_chunk",
    "inflate_bounded",
    "layout_problem",
    "piece_ok",
    "piece_topics",
    "unique_chunks",
    "wire_size",
    "with_pages_read",
]
