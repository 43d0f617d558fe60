"""Fetching a bundle file over MQTT in retained blocks, resumable across restarts.

The partial file (`<id>.part`) and a one-byte-per-block record (`<id>.part.blocks`) live in the
state directory. The record is a hint, not a promise: on resume every block it claims is checked
against its sha256 from the signed offer, so neither a `kill -9` nor a power cut can smuggle a bad
block in. That is what lets the hot path skip a per-block fsync (both files are fsync'd every
second and at the end). The agent subscribes to a window of missing block topics at a time, which
bounds what is in flight and in memory.

Each byte is hashed once on the device: every piece against its sha256 in the signed offer, before it
is written. There is no second, whole-file pass: the piece list and the whole-file sha256 are signed
together in the one offer, so whoever could make a wrong file pass every piece could sign a wrong
whole-file sha256 too. What that pass still caught is the device's own assembly (a piece at the wrong
place, a short write, a piece never written) and a layout its publisher signed that does not add up to
the file the manifest describes. The first is checked by construction here (offsets from the signed
sizes, every pwrite to its full length, every record byte set before the file is handed on); the
second is refused before anything is installed, when the tar is unpacked against the signed manifest
(core/bundle/archive.py `unpack_pinned`: the exact manifest bytes, every member pinned, each file's
size and sha256); the publisher derives the piece list and the whole-file sha256 from the same bytes
(control/publish/publisher.py, control/publish/chunks.py), so only a publisher bug makes them disagree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgefleet.agent.transfer.link import LinkPacer, Pacing
from edgefleet.core.errors import EdgefleetError
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

MAX_CORRUPT_PER_BLOCK = 3
SYNC_EVERY_S = 1.0
UNSUBSCRIBE_BATCH = 8
REFILL_SHARE = 4  # the window is topped up once a quarter of it is free: one SUBSCRIBE packet per batch, not per piece


class TransferError(EdgefleetError):
    """The bundle could not be fetched (stalled, corrupt, or no space)."""


class BlockDownload:
    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        offer: BundleOffer,
        part_path: Path,
        *,
        window: int = 16,
        stall_timeout_s: float = 20.0,
        max_stalls: int = 5,
        progress: Callable[[int, int], None] = lambda held, total: None,
        link: LinkPacer | None = None,
    ) -> None:
        self.conn, self.topics, self.offer = conn, topics, offer
        self.transfer = offer.transfer
        chunked = offer.transfer.chunks or offer.transfer.index or offer.transfer.chunk_count
        if self.unit_name == "blocks" and chunked:
            # Its block list is empty: fetching nothing, it would hand on a file of zeros (open_download picks).
            raise TransferError(f"offer {offer.bundle_id} lists chunks, not blocks: a block download refuses it")
        self.part_path = part_path
        self.record_path = part_path.with_name(part_path.name + ".blocks")
        self.meta_path = part_path.with_name(part_path.name + ".meta")
        self.window, self.stall_timeout_s, self.max_stalls = window, stall_timeout_s, max_stalls
        self.progress = progress
        self.bytes_received = 0  # what this run fetched: a resume should fetch only what was missing
        self.corrupt_blocks = 0
        self.rejected_on_resume = 0  # blocks the record claimed but whose bytes did not check out
        self._inbox: queue.Queue[tuple[int, bytes, bytes | None]] = queue.Queue()
        self.pacing = Pacing(link, *self._window_shape(window))  # cap, reports first, RTT-sized window

    unit_name = "blocks"

    def _window_shape(self, window: int) -> tuple[int, int]:
        """(initial requests in flight, bytes a request stands for) for the RTT window."""
        return window, self.transfer.block_size

    # --- persistent record
    def _open_record(self) -> bytearray:
        meta = {"sha256": self.transfer.sha256, "size": self.transfer.size, "block_size": self.transfer.block_size}
        try:
            same = json.loads(self.meta_path.read_text()) == meta
        except (OSError, ValueError):
            same = False
        if same and self.part_path.exists() and self.record_path.exists():
            record = bytearray(self.record_path.read_bytes())
            if len(record) == self.transfer.block_count and self.part_path.stat().st_size == self.transfer.size:
                return self._verified(record)
        # A new transfer (or a record from another one): start from nothing.
        for path in (self.part_path, self.record_path):
            path.unlink(missing_ok=True)
        with self.part_path.open("wb") as handle:
            handle.truncate(self.transfer.size)
        self.record_path.write_bytes(bytes(self.transfer.block_count))
        self.meta_path.write_text(json.dumps(meta))
        return bytearray(self.transfer.block_count)

    def _verified(self, record: bytearray) -> bytearray:
        """Keep only the claimed blocks whose bytes on disk match their hash."""
        with self.part_path.open("rb") as handle:
            for index, held in enumerate(record):
                if not held:
                    continue
                handle.seek(index * self.transfer.block_size)
                if not self._block_ok(index, handle.read(self._block_len(index))):
                    record[index] = 0
                    self.rejected_on_resume += 1
        if self.rejected_on_resume:
            log.warning(
                "%d recorded blocks failed their sha256 on resume; fetching them again", self.rejected_on_resume
            )
            self.record_path.write_bytes(bytes(record))
        return record

    def held_blocks(self) -> int:
        try:
            return sum(self.record_path.read_bytes())
        except OSError:
            return 0

    def cleanup(self) -> None:
        for path in (self.part_path, self.record_path, self.meta_path):
            path.unlink(missing_ok=True)

    def summary(self) -> str:
        return f"{self.bytes_received} bytes fetched"

    # --- what the fetch loop fetches: "units" (a block here; one distinct chunk in agent/transfer/chunks.py), each
    # on its own retained topic, written as the file's pieces (blocks, or chunks at their offsets) in order
    def _units(self, record: bytearray) -> list[int]:
        return [i for i in range(self.transfer.block_count) if not record[i]]

    def _unit_held(self, unit: int, record: bytearray) -> bool:
        return bool(record[unit])

    def _unit_topic(self, unit: int) -> str:
        return self.topics.bundle_block(self.offer.bundle_id, unit)

    def _unit_of(self, topic: str) -> int | None:
        index = self.topics.block_index_of(topic)
        return index if index is not None and 0 <= index < self.transfer.block_count else None

    def _unit_len(self, unit: int) -> int:
        return self._block_len(unit)

    def _check(self, unit: int, payload: bytes) -> bytes | None:
        """The unit's bytes if the payload is the signed unit, else None (runs on the network thread)."""
        return payload if self._block_ok(unit, payload) else None

    def _take(self, unit: int, data: bytes, part: BinaryIO, rec: BinaryIO, record: bytearray) -> int:
        """Write a checked unit where the file holds it, then its record byte. How many pieces it filled."""
        self._write_block(part, rec, unit, data)
        record[unit] = 1
        return 1

    # --- fetching
    def _on_block(self, topic: str, payload: bytes, retained: bool) -> None:
        unit = self._unit_of(topic)
        if unit is not None:
            # Checked here, on the network thread, so hashing runs beside the writer (hashlib frees the GIL).
            self._inbox.put((unit, payload, self._check(unit, payload)))

    def run(self) -> Path:
        record = self._open_record()
        total = len(record)  # pieces of the file (blocks or chunks), one record byte each
        held = sum(record)
        missing = deque(self._units(record))
        self.progress(held, total)
        requested: dict[int, str] = {}
        strikes: dict[int, int] = {}  # corrupt deliveries per unit
        stalls = 0
        finished: list[str] = []  # topics of blocks held, to unsubscribe in one packet
        try:
            with self.part_path.open("r+b") as part, self.record_path.open("r+b") as rec:
                last_sync = time.monotonic()
                while missing or requested:
                    fresh = []
                    room = self.pacing.window() - len(requested)
                    if requested and room < max(1, self.pacing.window() // REFILL_SHARE):
                        room = 0  # wait for a batch's worth of room: one SUBSCRIBE packet per batch
                    while missing and room > 0:
                        room -= 1
                        index = missing.popleft()
                        self.pacing.before_request(index, self._unit_len(index))
                        requested[index] = self._unit_topic(index)
                        fresh.append(requested[index])
                    self.conn.subscribe_many(fresh, self._on_block)  # one SUBSCRIBE packet for the lot
                    try:
                        index, payload, data = self._inbox.get(timeout=self.stall_timeout_s)
                    except queue.Empty:
                        stalls += 1
                        if stalls > self.max_stalls:
                            raise TransferError(
                                f"download stalled: nothing for {self.stall_timeout_s * stalls:.0f} s "
                                f"({held}/{total} {self.unit_name} held)"
                            ) from None
                        self._resubscribe(requested)
                        continue
                    if index not in requested or self._unit_held(index, record):
                        continue  # a duplicate or a unit we never asked for
                    stalls = 0
                    self.bytes_received += len(payload)
                    if data is None:
                        self.corrupt_blocks += 1
                        strikes[index] = strikes.get(index, 0) + 1
                        what = self.unit_name[:-1]
                        if strikes[index] >= MAX_CORRUPT_PER_BLOCK:
                            raise TransferError(
                                f"{what} {index} failed its sha256 {strikes[index]} times; the published bundle "
                                "is corrupt"
                            )
                        log.warning("%s %d of %s is corrupt; requesting it again", what, index, self.offer.bundle_id)
                        self.conn.unsubscribe(requested.pop(index))
                        self.pacing.on_retry(index)
                        missing.appendleft(index)
                        time.sleep(0.2)
                        continue
                    self.pacing.on_arrival(index, len(payload))
                    held += self._take(index, data, part, rec, record)
                    finished.append(requested.pop(index))
                    if len(finished) >= max(UNSUBSCRIBE_BATCH, self.pacing.window() // REFILL_SHARE):
                        self.conn.unsubscribe_many(finished)  # one UNSUBSCRIBE packet (a duplicate is ignored)
                        finished = []
                    if time.monotonic() - last_sync >= SYNC_EVERY_S:
                        _sync(part, rec)
                        last_sync = time.monotonic()
                    self.progress(held, total)
                _sync(part, rec)
        except OSError as err:
            raise TransferError(f"cannot write the download: {err}") from err
        finally:
            self.conn.unsubscribe_many([*requested.values(), *finished])
        return self._finish(record)

    def _resubscribe(self, requested: dict[int, str]) -> None:
        for topic in requested.values():
            self.conn.unsubscribe(topic)
            self.conn.subscribe(topic, self._on_block)

    def _block_len(self, index: int) -> int:
        return min(self.transfer.block_size, self.transfer.size - index * self.transfer.block_size)

    def _block_ok(self, index: int, payload: bytes) -> bool:
        return (
            len(payload) == self._block_len(index)
            and hashlib.sha256(payload).hexdigest() == self.transfer.block_sha256[index]
        )

    def _write_block(self, part: BinaryIO, rec: BinaryIO, index: int, payload: bytes) -> None:
        """Data first (to its full length), then its record byte (no fsync: see the module docstring)."""
        _pwrite_all(part.fileno(), payload, index * self.transfer.block_size)
        os.pwrite(rec.fileno(), b"\x01", index)

    def _finish(self, record: bytearray) -> Path:
        """The file is whole: every piece was checked against the signed offer and written to its full length
        at its signed offset (the module docstring says why no second, whole-file hash is needed)."""
        if not all(record) or self.part_path.stat().st_size != self.transfer.size:
            self.cleanup()
            raise TransferError("the assembled bundle lacks pieces of the offer; download discarded")
        return self.part_path


def _sync(*handles: BinaryIO) -> None:
    for handle in handles:
        os.fsync(handle.fileno())


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """All of `data` at `offset` (os.pwrite may write less than asked: a full disk, a signal)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"wrote nothing at offset {offset}")
        view, offset = view[written:], offset + written
