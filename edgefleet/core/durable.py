"""Crash-safe file writes: write a temporary file, fsync it, rename it over the target, fsync the directory.

A `kill -9` or a power cut at any point leaves the old content or the new, never a torn file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


__all__ = ["atomic_write", "fsync_dir"]


def copy_hashed(source: IO[bytes], out: IO[bytes] | None, chunk: int = 1 << 20) -> str:
    """Stream `source` into `out` (fsync'd; None: only read), returning the sha256 hex digest of what was read: a
    file checked against its pin as it is written (bundle and agent-release archives)."""
    digest = hashlib.sha256()
    while piece := source.read(chunk):
        digest.update(piece)
        if out is not None:
            out.write(piece)
    if out is not None:
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()
