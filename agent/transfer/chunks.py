"""Fetching a chunked bundle (core/transfer/chunks.py): take what the installed bundles hold, fetch only the rest.

The same resumable download as `BlockDownload` (agent/transfer/blocks.py): `<id>.part` at its final size, a record with
one byte per chunk of the offer, both checked on resume. Before anything is fetched, every chunk the device's index
(agent/transfer/chunk_index.py) finds in an installed bundle is read, checked against its signed sha256 and written in
place; then each distinct missing chunk is fetched once from its retained `chunks/{sha256}` topic, decoded within its
signed sizes, checked, and written wherever the file holds it. A kill -9 loses at most the chunks in flight, never one
whose record byte is written. Every chunk is
hashed once, against its signed name, before it is written; there is no second, whole-file pass
(agent/transfer/blocks.py says why, and what checks the assembled file instead).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

from edgefleet.agent.transfer.blocks import BlockDownload, _pwrite_all
from edgefleet.agent.transfer.chunk_index import ChunkIndex
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.chunks import ChunkError, chunk_offsets, decode_chunk, unique_chunks, wire_size

log = logging.getLogger(__name__)

MAX_WINDOW = 256  # chunk requests in flight at first, at most


class ChunkDownload(BlockDownload):
    unit_name = "chunks"

    def __init__(self, *args: Any, index: ChunkIndex | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index = index
        self.offsets = chunk_offsets(self.transfer)
        self.groups = list(unique_chunks(self.transfer))  # unit -> (chunk, every index holding it)
        self._unit_by_sha = {ref.sha256: unit for unit, (ref, _) in enumerate(self.groups)}
        self.local_chunks = 0  # chunks (by index) taken from installed bundles in this run
        self.local_bytes = 0
        self.fetched_chunks = 0

    def _window_shape(self, window: int) -> tuple[int, int]:
        """A chunk is smaller than a block (about a quarter): as many bytes in flight as `window` blocks, so the
        RTT window counts chunks of their mean size on the wire."""
        refs = self.transfer.chunks
        mean = max(1, sum(wire_size(ref) for ref in refs) // max(1, len(refs)))
        return min(MAX_WINDOW, max(window, -(-window * self.transfer.block_size // mean))), mean

    def _meta(self) -> dict[str, object]:
        listing = json.dumps([ref.model_dump() for ref in self.transfer.chunks], separators=(",", ":"))
        return {"sha256": self.transfer.sha256, "size": self.transfer.size, "layout": "chunks",
                "chunks": hashlib.sha256(listing.encode()).hexdigest()}  # fmt: skip

    def _open_record(self) -> bytearray:
        count = len(self.transfer.chunks)
        meta = self._meta()
        try:
            same = json.loads(self.meta_path.read_text()) == meta
        except (OSError, ValueError):
            same = False
        record: bytearray | None = None
        if same and self.part_path.exists() and self.record_path.exists():
            claimed = bytearray(self.record_path.read_bytes())
            if len(claimed) == count and self.part_path.stat().st_size == self.transfer.size:
                record = self._verified(claimed)
        if record is None:  # a new transfer (or a record from another one): start from nothing
            for path in (self.part_path, self.record_path):
                path.unlink(missing_ok=True)
            with self.part_path.open("wb") as handle:
                handle.truncate(self.transfer.size)
            self.record_path.write_bytes(bytes(count))
            self.meta_path.write_text(json.dumps(meta))
            record = bytearray(count)
        self._fill_from_index(record)
        return record

    def _verified(self, record: bytearray) -> bytearray:
        """Keep only the claimed chunks whose bytes on disk hash to their name."""
        with self.part_path.open("rb") as handle:
            for index, held in enumerate(record):
                if not held:
                    continue
                ref = self.transfer.chunks[index]
                handle.seek(self.offsets[index])
                if hashlib.sha256(handle.read(ref.size)).hexdigest() != ref.sha256:
                    record[index] = 0
                    self.rejected_on_resume += 1
        if self.rejected_on_resume:
            log.warning(
                "%d recorded chunks failed their sha256 on resume; fetching them again", self.rejected_on_resume
            )
            self.record_path.write_bytes(bytes(record))
        return record

    def _fill_from_index(self, record: bytearray) -> None:
        """Write every missing chunk an installed bundle holds (each read checked against its name)."""
        if self.index is None:
            return
        with self.part_path.open("r+b") as part, self.record_path.open("r+b") as rec:
            for ref, indices in self.groups:
                todo = [i for i in indices if not record[i]]
                if not todo or ref.sha256 not in self.index:
                    continue
                data = self.index.read(ref.sha256)
                if data is None:
                    continue
                self._write_chunk(part, rec, record, todo, data)
                self.local_chunks += len(todo)
                self.local_bytes += len(data) * len(todo)
            os.fsync(part.fileno())
            os.fsync(rec.fileno())

    def _write_chunk(self, part: BinaryIO, rec: BinaryIO, record: bytearray, indices: list[int], data: bytes) -> None:
        """Data first, then its record bytes (no fsync: see agent/transfer/blocks.py)."""
        for index in indices:
            _pwrite_all(part.fileno(), data, self.offsets[index])
        for index in indices:
            os.pwrite(rec.fileno(), b"\x01", index)
            record[index] = 1

    # --- the fetch loop's hooks (agent/transfer/blocks.py): a unit is one distinct chunk, a piece one chunk of the file
    def _units(self, record: bytearray) -> list[int]:
        return [unit for unit in range(len(self.groups)) if not self._unit_held(unit, record)]

    def _unit_held(self, unit: int, record: bytearray) -> bool:
        return all(record[i] for i in self.groups[unit][1])

    def _unit_topic(self, unit: int) -> str:
        return self.topics.chunk(self.groups[unit][0].sha256)

    def _unit_of(self, topic: str) -> int | None:
        sha = self.topics.chunk_of(topic)
        return self._unit_by_sha.get(sha) if sha is not None else None

    def _unit_len(self, unit: int) -> int:
        return wire_size(self.groups[unit][0])

    def _check(self, unit: int, payload: bytes) -> bytes | None:
        try:
            return decode_chunk(self.groups[unit][0], payload)
        except ChunkError as err:
            log.warning("refused a chunk of %s: %s", self.offer.bundle_id, err)
            return None

    def _take(self, unit: int, data: bytes, part: BinaryIO, rec: BinaryIO, record: bytearray) -> int:
        indices = [i for i in self.groups[unit][1] if not record[i]]
        self._write_chunk(part, rec, record, indices, data)
        self.fetched_chunks += 1
        return len(indices)

    def summary(self) -> str:
        return (
            f"{self.bytes_received} bytes fetched in {self.fetched_chunks} chunks, {self.local_chunks} chunks "
            f"({self.local_bytes} bytes) from installed bundles"
        )


def open_download(
    conn: Connection, topics: Topics, offer: BundleOffer, part_path: Path, *, bundles_dir: Path | None, **kwargs: Any
) -> BlockDownload:
    """The download an offer's layout needs: chunks (using the chunks installed under `bundles_dir`) or blocks."""
    if offer.transfer.chunks:
        index = ChunkIndex(bundles_dir) if bundles_dir is not None else None
        return ChunkDownload(conn, topics, offer, part_path, index=index, **kwargs)
    return BlockDownload(conn, topics, offer, part_path, **kwargs)


__all__ = ["ChunkDownload", "open_download"]
