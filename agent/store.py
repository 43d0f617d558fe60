"""The agent's state directory: installed bundles, the committed one, downloads in progress.

Layout under STATE_DIR:
  bundles/<bundle_id>/          unpacked, verified bundles (the committed one and N previous)
  bundles/<bundle_id>.staging/  a bundle being installed; removed on failure or at start-up
  downloads/<bundle_id>.part    a bundle file being fetched (resumable: see transfer.py)
  current -> bundles/<id>       the committed bundle; switched with an atomic rename
  state.json                    committed id, history, the highest version seen per model

Every switch is write-temp, fsync, rename, fsync-directory, so `kill -9` at any point leaves either
the old or the new bundle committed, never neither.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class AgentState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    committed: str | None = None
    history: list[str] = Field(default_factory=list, description="previously committed ids, newest first")
    versions: dict[str, str] = Field(default_factory=dict, description="model name -> highest version installed")
    refused: list[str] = Field(
        default_factory=list, description="'bundle@issued_at' this device gave up on; a new deploy retries"
    )


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


class Store:
    def __init__(self, root: Path, keep_previous: int = 2) -> None:
        self.root = root
        self.bundles = root / "bundles"
        self.downloads = root / "downloads"
        self.keep_previous = keep_previous
        for path in (self.root, self.bundles, self.downloads):
            path.mkdir(parents=True, exist_ok=True)
        self._state_path = root / "state.json"

    # --- state
    def load_state(self) -> AgentState:
        if not self._state_path.exists():
            return AgentState()
        try:
            return AgentState.model_validate_json(self._state_path.read_bytes())
        except ValueError as err:
            # state.json is only ever replaced atomically, so this means outside damage: start clean.
            log.error("state.json is unreadable (%s); starting without a committed bundle", err)
            return AgentState()

    def save_state(self, state: AgentState) -> None:
        atomic_write(self._state_path, state.model_dump_json(indent=2).encode())

    # --- paths
    def bundle_dir(self, bundle_id: str) -> Path:
        return self.bundles / bundle_id

    def staging_dir(self, bundle_id: str) -> Path:
        return self.bundles / f"{bundle_id}.staging"

    def download_path(self, bundle_id: str) -> Path:
        return self.downloads / f"{bundle_id}.part"

    # --- transitions
    def clean_incomplete(self) -> list[str]:
        """Remove staging directories left by a crash; downloads stay so they can resume."""
        removed = []
        for path in self.bundles.glob("*.staging"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
        for tmp in self.root.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        return removed

    def commit(self, bundle_id: str, model_name: str, model_version: str) -> AgentState:
        """Promote a staged bundle to committed: rename, switch `current`, record state, prune."""
        staging, final = self.staging_dir(bundle_id), self.bundle_dir(bundle_id)
        if staging.exists():
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            fsync_dir(self.bundles)
        link_tmp = self.root / ".current.tmp"
        link_tmp.unlink(missing_ok=True)
        os.symlink(Path("bundles") / bundle_id, link_tmp)
        os.replace(link_tmp, self.root / "current")
        fsync_dir(self.root)
        state = self.load_state()
        history = [b for b in ([state.committed] if state.committed else []) + state.history if b != bundle_id]
        versions = dict(state.versions)
        versions[model_name] = model_version
        state = AgentState(
            committed=bundle_id, history=history[: self.keep_previous], versions=versions, refused=state.refused
        )
        self.save_state(state)
        self._prune(state)
        return state

    def remember_refusal(self, key: str, keep: int = 100) -> None:
        state = self.load_state()
        if key not in state.refused:
            self.save_state(state.model_copy(update={"refused": [*state.refused, key][-keep:]}))

    def _prune(self, state: AgentState) -> None:
        keep = {state.committed, *state.history}
        for path in self.bundles.iterdir():
            if path.is_dir() and not path.name.endswith(".staging") and path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)
        for part in self.downloads.iterdir():
            if part.name.split(".part")[0] in keep:
                part.unlink(missing_ok=True)
