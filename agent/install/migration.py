"""Upgrading a state directory written by a single-model agent: what it ran becomes slot "default"'s, unchanged.

A single-model agent kept its committed bundle, history, version floor (two copies), floor holders, refusals,
partial downloads and `current` link at the top of STATE_DIR, and its accepted desired documents in
`trust/desired/*.json`. They move under `slots/default/` and `trust/desired/default/`; the installed bundles stay in
`bundles/` (nothing is downloaded again), and the desired counters keep their values (agent/install/desired.py
reads a counter without a slot as slot "default"'s). Each file moves with one rename, `state.json` last, so a crash
part way leaves a directory this function finishes on the next start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edgefleet.agent.install.store import SLOTS_DIR
from edgefleet.core.durable import fsync_dir
from edgefleet.core.topics import DEFAULT_SLOT

log = logging.getLogger(__name__)

_SLOT_FILES = ("floor_holders.json", "floor.json", "state.json")  # state.json last: its presence marks the old layout


def migrate_single_model(root: Path) -> list[str]:
    """Move a single-model layout under slot "default"; returns what moved (nothing for a slots layout)."""
    moved: list[str] = []
    slot_dir = root / SLOTS_DIR / DEFAULT_SLOT
    documents = root / "trust" / "desired"
    old_documents = sorted(documents.glob("*.json")) if documents.is_dir() else []
    if old_documents:
        (documents / DEFAULT_SLOT).mkdir(parents=True, exist_ok=True)
        for path in old_documents:
            os.replace(path, documents / DEFAULT_SLOT / path.name)
            moved.append(f"trust/desired/{path.name}")
        fsync_dir(documents / DEFAULT_SLOT)
    if not (root / "state.json").exists() and not (root / "floor.json").exists():
        return moved
    slot_dir.mkdir(parents=True, exist_ok=True)
    downloads = root / "downloads"
    if downloads.is_dir():
        (slot_dir / "downloads").mkdir(exist_ok=True)
        for part in downloads.iterdir():
            os.replace(part, slot_dir / "downloads" / part.name)
            moved.append(f"downloads/{part.name}")
        downloads.rmdir()
    current = root / "current"
    if current.is_symlink():
        target = Path(os.readlink(current))
        link = slot_dir / "current"
        link.unlink(missing_ok=True)
        os.symlink(Path("..") / ".." / target, link)
        current.unlink()
        moved.append("current")
    for name in _SLOT_FILES:
        source = root / name
        if source.exists():
            os.replace(source, slot_dir / name)
            moved.append(name)
    fsync_dir(slot_dir)
    fsync_dir(root)
    if moved:
        log.info("state directory of a single-model agent: %s now belong to slot %s", ", ".join(moved), DEFAULT_SLOT)
    return moved


__all__ = ["migrate_single_model"]
