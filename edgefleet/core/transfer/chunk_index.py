"""The chunk list of a big bundle as index pages: content-addressed chunks themselves, listed in the signed offer.

An offer lists its chunks inline (about 110 bytes of JSON each) while that list stays under `INLINE_MAX`; past it
(a bundle of some tens of MB) the offer would outgrow one MQTT message (the shipped broker's `max_packet_size` is
256 KiB, AWS IoT Core caps a message at 128 KB). Then the host writes the ordered list as a compact binary index,
`ENTRY` bytes per chunk (the 32-byte sha256, the u32 size, the u32 zstd length or 0 when the chunk travels raw,
big-endian), cuts it into pages of at most `block_size` bytes (whole entries), and publishes each page as an ordinary
raw chunk on `chunks/{sha256}` (broker rights, dedupe and retention treat it like any chunk). The signed offer lists
only the pages (`Transfer.index`) and the chunk count: about 110 bytes per 3,276 chunks at 128 KiB.

A device checks the counts before it fetches anything (`index_problem`: the pages add up to `chunk_count` entries, none
is bigger than a chunk may be, and `chunk_count` is possible for the file's size), fetches the pages, checks each
against its signed sha256 (core/transfer/chunks.py `decode_chunk`) before it reads a byte of it, and only then decodes
the entries (`expand`). The expanded transfer carries both the pages and the chunks; `offer_signing_bytes` signs the
pages, never the inline list, so `pages_match` is what ties such a list to the signature (core/transfer/blocks.py
`verify_offer` checks it).
"""

from __future__ import annotations

import hashlib
import json
import struct

from edgefleet.core.messages import ChunkRef, Transfer

INLINE_MAX = 64 * 1024  # bytes of inline chunk list JSON an offer carries before it switches to index pages
ENTRY = struct.Struct(">32sII")  # sha256, size, zstd length (0: raw)
MIN_MEAN_CHUNK = 1024  # a device refuses an index averaging smaller chunks (beyond SLACK_CHUNKS): absurd counts
SLACK_CHUNKS = 4096  # tar headers and small members make small chunks: a small bundle may be all small chunks


def inline_size(chunks: list[ChunkRef]) -> int:
    """Bytes the chunk list takes inline in an offer's JSON."""
    return len(json.dumps([ref.model_dump() for ref in chunks], separators=(",", ":")))


def needs_index(chunks: list[ChunkRef], inline_max: int = INLINE_MAX) -> bool:
    return inline_size(chunks) > inline_max


def max_chunks(size: int) -> int:
    """The most chunks a device accepts for a file of `size` bytes (the host refuses to publish more)."""
    return size // MIN_MEAN_CHUNK + SLACK_CHUNKS


def encode_pages(chunks: list[ChunkRef], page_size: int) -> list[bytes]:
    """The ordered chunk list as index pages of at most `page_size` bytes (whole entries)."""
    per_page = page_size // ENTRY.size
    if per_page < 1:
        raise ValueError(f"an index page of {page_size} bytes cannot hold one {ENTRY.size}-byte entry")
    pages = []
    for start in range(0, len(chunks), per_page):
        page = bytearray()
        for ref in chunks[start : start + per_page]:
            page += ENTRY.pack(bytes.fromhex(ref.sha256), ref.size, ref.zstd or 0)
        pages.append(bytes(page))
    return pages


def page_refs(pages: list[bytes]) -> list[ChunkRef]:
    """Each page as the chunk it is published as (raw: its entries barely compress)."""
    return [ChunkRef(sha256=hashlib.sha256(page).hexdigest(), size=len(page)) for page in pages]


def index_problem(transfer: Transfer) -> str | None:
    """Why a paged layout is impossible, or None; checked before a page is fetched, so nothing is allocated for a
    count the sizes cannot back."""
    if not transfer.index:
        return None if not transfer.chunk_count else "an offer without index pages declares a chunk count"
    if transfer.block_sha256:
        return "an offer lists either blocks or chunks, not both"
    if transfer.chunk_count < 1 or transfer.chunk_count > max_chunks(transfer.size):
        return (
            f"{transfer.chunk_count} chunks for {transfer.size} bytes (a device accepts 1 to "
            f"{max_chunks(transfer.size)})"
        )
    listed = 0
    for number, page in enumerate(transfer.index):
        if page.zstd is not None:
            return f"index page {number} is compressed; pages travel raw"
        if page.size > transfer.block_size or page.size % ENTRY.size:
            return f"index page {number} is {page.size} bytes (whole {ENTRY.size}-byte entries, at most a chunk)"
        listed += page.size // ENTRY.size
    if listed != transfer.chunk_count:
        return f"the index pages hold {listed} entries; the offer declares {transfer.chunk_count} chunks"
    return None


def decode_page(page: bytes) -> list[ChunkRef]:
    """The entries of one page (already checked against its signed sha256). ValueError for an impossible entry."""
    refs = []
    for sha, size, zstd in ENTRY.iter_unpack(page):
        refs.append(ChunkRef(sha256=sha.hex(), size=size, zstd=zstd or None))
    return refs


def expand(transfer: Transfer, pages: list[bytes]) -> Transfer:
    """The transfer with its chunk list read from its (checked) pages, in order."""
    chunks = [ref for page in pages for ref in decode_page(page)]
    return transfer.model_copy(update={"chunks": chunks})


def pages_match(transfer: Transfer) -> bool:
    """Whether an expanded transfer's inline chunk list is exactly what its signed pages hold."""
    if not transfer.index or not transfer.chunks:
        return True  # nothing inline beside the pages: the pages alone are what was signed
    sizes = [page.size for page in transfer.index]
    if len(set(sizes[:-1])) > 1 or (len(sizes) > 1 and sizes[-1] > sizes[0]):
        return False  # pages are cut at one size: anything else did not come from encode_pages
    return page_refs(encode_pages(transfer.chunks, sizes[0])) == list(transfer.index)


__all__ = [
    "ENTRY",
    "INLINE_MAX",
    "decode_page",
    "encode_pages",
    "expand",
    "index_problem",
    "inline_size",
    "max_chunks",
    "needs_index",
    "page_refs",
    "pages_match",
]
