"""The block layout of a bundle file on MQTT: fixed-size blocks, each with its own sha256."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from edgefleet.core.messages import Transfer

DEFAULT_BLOCK_SIZE = 128 * 1024  # AWS IoT Core caps payloads at 128 KB; EMQX defaults to 1 MB


def describe_transfer(path: Path, block_size: int = DEFAULT_BLOCK_SIZE) -> Transfer:
    whole = hashlib.sha256()
    blocks: list[str] = []
    for block in iter_blocks(path, block_size):
        whole.update(block)
        blocks.append(hashlib.sha256(block).hexdigest())
    return Transfer(size=path.stat().st_size, sha256=whole.hexdigest(), block_size=block_size, block_sha256=blocks)


def iter_blocks(path: Path, block_size: int) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while block := handle.read(block_size):
            yield block
