"""The device's chunk index: which chunks of a new offer it already holds, in the bundles it installed.

An installed bundle is kept unpacked (the tar itself is deleted after install), so the index maps each chunk of its
offer that lies inside one file's data to (file, offset, size): `chunks.json`, written beside the bundle's files
when it is staged, from the tar's member offsets and the signed chunk list. Chunks that span tar headers or padding
are not indexed (they are small, and differ between versions anyway). The index is a hint: every chunk read from
it is checked against its sha256 before it goes into a download, so a modified or damaged file costs a fetch, never
a bad byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgefleet.core.messages import Transfer
from edgefleet.core.transfer.chunks import chunk_offsets

log = logging.getLogger(__name__)

INDEX_NAME = "chunks.json"


@dataclass(frozen=True)
class Located:
    path: Path
    offset: int
    size: int


def index_bundle_file(bundle_file: Path, transfer: Transfer) -> dict[str, tuple[str, int, int]]:
    """sha256 -> (member path, offset in the member, size) for each chunk that lies inside one member's data."""
    spans: list[tuple[int, int, str]] = []
    with tarfile.open(bundle_file, "r:") as tar:
        spans = [(m.offset_data, m.offset_data + m.size, m.name) for m in tar if m.isfile() and m.size]
    index: dict[str, tuple[str, int, int]] = {}
    span = 0
    for ref, start in zip(transfer.chunks, chunk_offsets(transfer), strict=True):
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span < len(spans) and spans[span][0] <= start and start + ref.size <= spans[span][1]:
            index.setdefault(ref.sha256, (spans[span][2], start - spans[span][0], ref.size))
    return index


def write_index(bundle_dir: Path, bundle_file: Path, transfer: Transfer) -> None:
    """Record the chunk index of a staged bundle (nothing for a block-layout offer)."""
    if not transfer.chunks:
        return
    index = index_bundle_file(bundle_file, transfer)
    (bundle_dir / INDEX_NAME).write_text(json.dumps({"schema_version": 1, "chunks": index}))


class ChunkIndex:
    """The chunks held by the installed bundles under `bundles_dir` (committed and previous ones)."""

    def __init__(self, bundles_dir: Path) -> None:
        self.entries: dict[str, Located] = {}
        for directory in sorted(bundles_dir.iterdir()) if bundles_dir.is_dir() else []:
            if not directory.is_dir() or directory.name.endswith(".staging"):
                continue
            self._load(directory)

    def _load(self, directory: Path) -> None:
        try:
            data = json.loads((directory / INDEX_NAME).read_text())
            chunks = data["chunks"]
            for sha, (rel, offset, size) in chunks.items():
                path = directory.joinpath(*PurePosixPath(rel).parts)
                if ".." in PurePosixPath(rel).parts or not path.resolve().is_relative_to(directory.resolve()):
                    continue
                self.entries.setdefault(sha, Located(path, int(offset), int(size)))
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring the unreadable chunk index of %s: %s", directory.name, err)

    def __contains__(self, sha: str) -> bool:
        return sha in self.entries

    def read(self, sha: str) -> bytes | None:
        """The chunk's bytes if the installed file still holds them (checked), else None."""
        where = self.entries.get(sha)
        if where is None:
            return None
        try:
            with where.path.open("rb") as handle:
                handle.seek(where.offset)
                data = handle.read(where.size)
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == sha else None


__all__ = ["INDEX_NAME", "ChunkIndex", "index_bundle_file", "write_index"]
