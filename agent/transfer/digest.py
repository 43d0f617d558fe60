"""The whole-file sha256 of a download, computed while it arrives instead of in a second pass over the disk.

Blocks are requested in order and mostly arrive in order, so the digest follows the contiguous prefix: a block
that arrives early waits in memory (at most `max_pending` of them; beyond that they are dropped and read back
from disk when the prefix reaches them), and a block held from an earlier run is read from the partial file.
`finish()` hashes whatever the prefix has not reached yet, from disk, so the result is always the file's sha256.
The hashing runs on its own thread (hashlib releases the GIL), beside the writes and the per-block checks.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable


class OrderedDigest:
    def __init__(self, total: int, held_before: Callable[[int], bool], read_block: Callable[[int], bytes],
                 max_pending: int = 64) -> None:  # fmt: skip
        """`held_before(i)`: block i was on disk before this run started (it will not be `add`ed)."""
        self.total, self._held, self._read = total, held_before, read_block
        self.max_pending = max_pending
        self._hash = hashlib.sha256()
        self._next = 0
        self._pending: dict[int, bytes] = {}
        self.read_back = 0  # blocks hashed from disk rather than from memory
        self._inbox: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=max(1, max_pending))
        self._error: BaseException | None = None
        self._worker = threading.Thread(target=self._work, name="ordered-digest", daemon=True)
        self._worker.start()

    def add(self, index: int, payload: bytes) -> None:
        """`payload` is block `index`, already checked against its signed hash and written."""
        self._inbox.put((index, payload))

    def _work(self) -> None:
        try:
            while (item := self._inbox.get()) is not None:
                self._add(*item)
        except BaseException as err:  # re-raised by finish() on the downloader's thread
            self._error = err
            while self._inbox.get() is not None:
                pass

    def _add(self, index: int, payload: bytes) -> None:
        if index < self._next:
            return
        if index > self._next:
            if len(self._pending) < self.max_pending:
                self._pending[index] = payload
            return
        self._hash.update(payload)
        self._next += 1
        self._advance(final=False)

    def _advance(self, final: bool) -> None:
        while self._next < self.total:
            payload = self._pending.pop(self._next, None)
            if payload is None:
                if not (final or self._held(self._next)):
                    return
                payload = self._read(self._next)
                self.read_back += 1
            self._hash.update(payload)
            self._next += 1

    def finish(self) -> str:
        """The sha256 hex digest of the whole file (every block must be on disk by now)."""
        self.close()
        if self._error is not None:
            raise self._error
        self._advance(final=True)
        self._pending.clear()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the hashing thread (idempotent); `finish()` calls it."""
        if self._worker.is_alive():
            self._inbox.put(None)
            self._worker.join()
