"""Fetching a bundle file over MQTT in retained blocks, resumable across restarts.

The partial file (`<id>.part`) and a one-byte-per-block record (`<id>.part.blocks`) live in the
state directory. A block is written and fsync'd before its record byte is set, so after a crash the
record never claims a block the file lacks; on restart only missing blocks are requested. The agent
subscribes to a window of missing block topics at a time, which bounds what is in flight.
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

from edgefleet.core.errors import EdgefleetError
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

MAX_CORRUPT_PER_BLOCK = 3


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
        window: int = 8,
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
            if len(record) == self.transfer.block_count:
                return record
        # A new transfer (or a record from another one): start from nothing.
        for path in (self.part_path, self.record_path):
            path.unlink(missing_ok=True)
        with self.part_path.open("wb") as handle:
            handle.truncate(self.transfer.size)
        self.record_path.write_bytes(bytes(self.transfer.block_count))
        self.meta_path.write_text(json.dumps(meta))
        return bytearray(self.transfer.block_count)

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
                            raise TransferError(
                                f"download stalled: no block for {self.stall_timeout_s * stalls:.0f} s "
                                f"({total - len(missing) - len(requested)}/{total} blocks held)"
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
                    self.progress(sum(record), total)
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

    def _block_ok(self, index: int, payload: bytes) -> bool:
        expected_len = min(self.transfer.block_size, self.transfer.size - index * self.transfer.block_size)
        return len(payload) == expected_len and hashlib.sha256(payload).hexdigest() == self.transfer.block_sha256[index]

    def _write_block(self, part, rec, index: int, payload: bytes) -> None:  # type: ignore[no-untyped-def]
        part.seek(index * self.transfer.block_size)
        part.write(payload)
        part.flush()
        os.fsync(part.fileno())
        rec.seek(index)
        rec.write(b"\x01")
        rec.flush()
        os.fsync(rec.fileno())

    def _finish(self) -> Path:
        digest = hashlib.sha256()
        with self.part_path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != self.transfer.sha256:
            self.cleanup()
            raise TransferError("the assembled bundle's sha256 does not match the offer; download discarded")
        return self.part_path
