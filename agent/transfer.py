"""Fetching a bundle file over MQTT in retained blocks, resumable across restarts.

The partial file (`<id>.part`) and a one-byte-per-block record (`<id>.part.blocks`) live in the
state directory. The record is a hint, not a promise: on resume every block it claims is checked
against its sha256 from the signed offer, so neither a `kill -9` nor a power cut can smuggle a bad
block in. That is what lets the hot path skip a per-block fsync (both files are fsync'd every
second and at the end). The agent subscribes to a window of missing block topics at a time, which
bounds what is in flight and in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgefleet.core.errors import EdgefleetError
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

MAX_CORRUPT_PER_BLOCK = 3
SYNC_EVERY_S = 1.0


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
    ) -> None:
        self.conn, self.topics, self.offer = conn, topics, offer
        self.transfer = offer.transfer
        self.part_path = part_path
        self.record_path = part_path.with_name(part_path.name + ".blocks")
        self.meta_path = part_path.with_name(part_path.name + ".meta")
        self.window, self.stall_timeout_s, self.max_stalls = window, stall_timeout_s, max_stalls
        self.progress = progress
        self.bytes_received = 0  # what this run fetched: a resume should fetch only what was missing
        self.corrupt_blocks = 0
        self.rejected_on_resume = 0  # blocks the record claimed but whose bytes did not check out
        self._inbox: queue.Queue[tuple[int, bytes]] = queue.Queue()

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

    # --- fetching
    def _on_block(self, topic: str, payload: bytes, retained: bool) -> None:
        index = self.topics.block_index_of(topic)
        if index is not None:
            self._inbox.put((index, payload))

    def run(self) -> Path:
        record = self._open_record()
        total = self.transfer.block_count
        missing = [i for i in range(total) if not record[i]]
        self.progress(total - len(missing), total)
        requested: dict[int, str] = {}
        strikes: dict[int, int] = {}  # corrupt deliveries per block
        stalls = 0
        try:
            with self.part_path.open("r+b") as part, self.record_path.open("r+b") as rec:
                last_sync = time.monotonic()
                while missing or requested:
                    while missing and len(requested) < self.window:
                        index = missing.pop(0)
                        topic = self.topics.bundle_block(self.offer.bundle_id, index)
                        requested[index] = topic
                        self.conn.subscribe(topic, self._on_block)
                    try:
                        index, payload = self._inbox.get(timeout=self.stall_timeout_s)
                    except queue.Empty:
                        stalls += 1
                        if stalls > self.max_stalls:
                            held = total - len(missing) - len(requested)
                            raise TransferError(
                                f"download stalled: no block for {self.stall_timeout_s * stalls:.0f} s "
                                f"({held}/{total} blocks held)"
                            ) from None
                        self._resubscribe(requested)
                        continue
                    if index not in requested or record[index]:
                        continue  # a duplicate or a block we never asked for
                    stalls = 0
                    self.bytes_received += len(payload)
                    if not self._block_ok(index, payload):
                        self.corrupt_blocks += 1
                        strikes[index] = strikes.get(index, 0) + 1
                        if strikes[index] >= MAX_CORRUPT_PER_BLOCK:
                            raise TransferError(
                                f"block {index} failed its sha256 {strikes[index]} times; the published bundle "
                                "is corrupt"
                            )
                        log.warning("block %d of %s is corrupt; requesting it again", index, self.offer.bundle_id)
                        self.conn.unsubscribe(requested.pop(index))
                        missing.insert(0, index)
                        time.sleep(0.2)
                        continue
                    self._write_block(part, rec, index, payload)
                    record[index] = 1
                    self.conn.unsubscribe(requested.pop(index))
                    if time.monotonic() - last_sync >= SYNC_EVERY_S:
                        _sync(part, rec)
                        last_sync = time.monotonic()
                    self.progress(total - len(missing) - len(requested), total)
                _sync(part, rec)
        except OSError as err:
            raise TransferError(f"cannot write the download: {err}") from err
        finally:
            for topic in requested.values():
                self.conn.unsubscribe(topic)
        return self._finish()

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
        """Data first, then its record byte (no fsync: see the module docstring)."""
        os.pwrite(part.fileno(), payload, index * self.transfer.block_size)
        os.pwrite(rec.fileno(), b"\x01", index)

    def _finish(self) -> Path:
        digest = hashlib.sha256()
        with self.part_path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != self.transfer.sha256:
            self.cleanup()
            raise TransferError("the assembled bundle's sha256 does not match the offer; download discarded")
        return self.part_path


def _sync(*handles: BinaryIO) -> None:
    for handle in handles:
        os.fsync(handle.fileno())
