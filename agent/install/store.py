"""The agent's state directory: installed bundles, each slot's committed one, downloads in progress.

A device runs one model per slot (edgefleet/core/topics.py); a `Store` is one slot's view of the state directory
(`for_slot` gives another slot's, sharing the lock). Layout under STATE_DIR:
  bundles/<bundle_id>/          unpacked, verified bundles (every slot's committed one and N previous)
  bundles/<bundle_id>.staging/  a bundle being installed; removed on failure or at start-up
  slots/<slot>/                 one slot's own state:
    downloads/<bundle_id>.part    a bundle file being fetched (resumable: see transfer.py)
    current -> ../../bundles/<id> the committed bundle; switched with an atomic rename
    state.json                    committed id, history, the version floor per model, refusals, commit events owed
    floor.json                    second copy of the version floor (written first, fsync'd)
    floor_holders.json            per model: the bundle that committed the floor version (id and signed manifest's
                                  sha256): that exact bundle may be installed again at the floor (a retried rollout)
  trust/                        the adopted key set, desired-state counters and documents (agent/install/trust.py,
                                desired.py)
A single-model agent kept a slot's files at the top; agent/install/migration.py moves them under slots/default.

Every switch is write-temp, fsync, rename, fsync-directory, so `kill -9` at any point leaves either
the old or the new bundle committed, never neither. Every write goes through this class under one lock
(the install worker and the health thread both change state). The floor (highest version ever committed
per model) only rises: it is the max of both copies, so losing or corrupting state.json never lowers it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.core.bundle.archive import MANIFEST_NAME
from edgefleet.core.bundle.manifest import parse_version
from edgefleet.core.durable import atomic_write, fsync_dir
from edgefleet.core.topics import DEFAULT_SLOT, check_slot

log = logging.getLogger(__name__)


class CommitNotice(BaseModel):
    """A "committed" event the fleet is owed. It is written in the same atomic write as the commit and cleared only
    once the event is in the disk spool, so a crash between the two repeats the event instead of losing it."""

    model_config = ConfigDict(extra="forbid")
    bundle_id: str
    detail: str
    ts: float = Field(description="when the commit happened: a replay after a crash keeps the time")


class AgentState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    committed: str | None = None
    history: list[str] = Field(default_factory=list, description="previously committed ids, newest first")
    versions: dict[str, str] = Field(
        default_factory=dict, description="model name -> version floor: the highest version ever committed"
    )
    refused: list[str] = Field(
        default_factory=list, description="'bundle@issued_at' this device gave up on; a new deploy retries"
    )
    unannounced: list[CommitNotice] = Field(
        default_factory=list, description="commits whose event may not have reached the spool yet, oldest first"
    )


class FloorHolder(BaseModel):
    """The bundle that committed a model's floor version: the same signed bundle may be installed again at the
    floor (a rollout retried after a rollback); another bundle reusing the version may not."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: str
    bundle_id: str
    manifest_sha256: str = Field(description="sha256 of the signed manifest's bytes (the offer's manifest_json)")


def raise_floor(floor: dict[str, str], model_name: str, version: str) -> dict[str, str]:
    merged = dict(floor)
    if model_name not in merged or parse_version(version) > parse_version(merged[model_name]):
        merged[model_name] = version
    return merged


def merge_floors(*floors: dict[str, str]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for floor in floors:
        for model_name, version in floor.items():
            try:
                merged = raise_floor(merged, model_name, version)
            except ValueError:
                log.error("ignoring an unparsable floor version %r for %s", version, model_name)
    return merged


ABANDONED_DOWNLOAD_S = 3 * 86400.0
MAX_UNANNOUNCED = 20  # owed commit events kept while the spool cannot take them (a full disk)


SLOTS_DIR = "slots"
_LOCKS: dict[Path, threading.RLock] = {}  # one lock per state directory, shared by its slots' views
_LOCKS_LOCK = threading.Lock()


def _lock_of(root: Path) -> threading.RLock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(root.resolve(), threading.RLock())


class Store:
    def __init__(self, root: Path, keep_previous: int = 2, slot: str = DEFAULT_SLOT) -> None:
        self.root = root
        self.slot = check_slot(slot)
        self.slot_dir = root / SLOTS_DIR / slot
        self.bundles = root / "bundles"
        self.downloads = self.slot_dir / "downloads"
        self.keep_previous = keep_previous
        for path in (self.root, self.bundles, self.downloads):
            path.mkdir(parents=True, exist_ok=True)
        self._state_path = self.slot_dir / "state.json"
        self._floor_path = self.slot_dir / "floor.json"
        self._holders_path = self.slot_dir / "floor_holders.json"
        self._lock = _lock_of(root)

    def for_slot(self, slot: str) -> Store:
        """Slot `slot`'s view of the same state directory (one lock for all)."""
        return Store(self.root, self.keep_previous, slot)

    def slots(self) -> list[str]:
        """The slots with a committed bundle on disk."""
        found = []
        for path in sorted((self.root / SLOTS_DIR).glob("*/state.json")):
            try:
                name = check_slot(path.parent.name)
            except ValueError:
                continue
            if self.for_slot(name).load_state().committed:
                found.append(name)
        return found

    # --- state
    def load_state(self) -> AgentState:
        """state.json with its floor merged with the second copy (floor.json): the floor never reads lower."""
        with self._lock:
            state = AgentState()
            if self._state_path.exists():
                try:
                    state = AgentState.model_validate_json(self._state_path.read_bytes())
                except ValueError as err:
                    # state.json is only ever replaced atomically, so this means outside damage: start clean,
                    # but keep the floor from its second copy.
                    log.error("state.json is unreadable (%s); starting without a committed bundle", err)
            floor = merge_floors(state.versions, self._read_floor_copy())
            return state.model_copy(update={"versions": floor})

    def save_state(self, state: AgentState) -> None:
        with self._lock:
            floor = merge_floors(self._read_floor_copy(), state.versions)
            if floor != self._read_floor_copy():
                atomic_write(self._floor_path, json.dumps(floor, indent=2).encode())
            state = state.model_copy(update={"versions": merge_floors(floor, state.versions)})
            # Written only while an event is owed (a moment): an older agent (extra="forbid") still reads the file.
            text = state.model_dump_json(indent=2, exclude=None if state.unannounced else {"unannounced"})
            atomic_write(self._state_path, text.encode())

    def floor(self) -> dict[str, str]:
        return self.load_state().versions

    def floor_holders(self) -> dict[str, FloorHolder]:
        """model name → the bundle that committed its floor version (a damaged file: none, so no retry is allowed
        at the floor, and the floor itself still holds)."""
        try:
            data = json.loads(self._holders_path.read_bytes())
            return {str(k): FloorHolder.model_validate(v) for k, v in data.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, AttributeError) as err:
            log.error("floor_holders.json is unreadable (%s); no bundle may be reinstalled at its floor", err)
            return {}

    def _hold_floor(self, versions: dict[str, str], bundle_id: str, model_name: str, model_version: str) -> None:
        """Record `bundle_id` as the holder of its model's floor when its version is the floor now."""
        if versions.get(model_name) != model_version:
            return
        manifest = self.bundle_dir(bundle_id) / MANIFEST_NAME
        try:
            digest = hashlib.sha256(manifest.read_bytes()).hexdigest()
        except OSError as err:
            log.error("cannot read %s's manifest to record it at the floor: %s", bundle_id, err)
            return
        holders = self.floor_holders()
        holders[model_name] = FloorHolder(version=model_version, bundle_id=bundle_id, manifest_sha256=digest)
        text = json.dumps({k: v.model_dump() for k, v in holders.items()}, indent=2)
        atomic_write(self._holders_path, text.encode())

    def _read_floor_copy(self) -> dict[str, str]:
        try:
            data = json.loads(self._floor_path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError as err:
            log.error("floor.json is unreadable (%s); using the floor in state.json", err)
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in data.items()}

    # --- small documents other parts of the agent keep (trust/keyset.json, trust/counters.json)
    def read_blob(self, rel: str) -> bytes | None:
        with self._lock:
            try:
                return (self.root / rel).read_bytes()
            except FileNotFoundError:
                return None

    def write_blob(self, rel: str, data: bytes) -> None:
        with self._lock:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)

    # --- paths
    def bundle_dir(self, bundle_id: str) -> Path:
        return self.bundles / bundle_id

    def staging_dir(self, bundle_id: str) -> Path:
        return self.bundles / f"{bundle_id}.staging"

    def download_path(self, bundle_id: str) -> Path:
        return self.downloads / f"{bundle_id}.part"

    # --- transitions
    def clean_incomplete(self, *, abandoned_after_s: float = ABANDONED_DOWNLOAD_S) -> list[str]:
        """Remove staging directories left by a crash, temp files, and downloads untouched for
        `abandoned_after_s` (a recent one stays so it can resume)."""
        with self._lock:
            removed = []
            for path in self.bundles.glob("*.staging"):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
            for tmp in [*self.root.glob(".*.tmp"), *self.root.glob("trust/.*.tmp"), *self.root.glob("slots/*/.*.tmp")]:
                tmp.unlink(missing_ok=True)
            cutoff = time.time() - abandoned_after_s
            for part in list(self.root.glob(f"{SLOTS_DIR}/*/downloads/*")):
                if part.stat().st_mtime < cutoff:
                    part.unlink(missing_ok=True)
                    removed.append(f"downloads/{part.name}")
            return removed

    def prune_downloads(self, keep: str | None) -> list[str]:
        """Delete every partial download (.part, .blocks, .meta) except those of bundle `keep`: only one
        download is ever in progress, so anything else was abandoned."""
        with self._lock:
            removed = []
            for part in list(self.downloads.iterdir()):
                if keep is None or part.name.split(".part")[0] != keep:
                    part.unlink(missing_ok=True)
                    removed.append(part.name)
            return removed

    def commit(
        self,
        bundle_id: str,
        model_name: str,
        model_version: str,
        *,
        raise_floor: bool = True,
        notice: CommitNotice | None = None,
    ) -> AgentState:
        """Promote a staged bundle to committed: rename, switch `current`, record state, prune. An install raises
        the model's floor; a local rollback or start-up fallback (`raise_floor=False`) leaves it where it is.
        `notice`: the event this commit owes, recorded in the same write (agent/install/commit_notice.py sends it)."""
        with self._lock:
            staging, final = self.staging_dir(bundle_id), self.bundle_dir(bundle_id)
            if staging.exists():
                if final.exists():
                    shutil.rmtree(final)
                os.replace(staging, final)
                fsync_dir(self.bundles)
            link_tmp = self.slot_dir / ".current.tmp"
            link_tmp.unlink(missing_ok=True)
            os.symlink(Path("..") / ".." / "bundles" / bundle_id, link_tmp)
            os.replace(link_tmp, self.slot_dir / "current")
            fsync_dir(self.slot_dir)
            state = self.load_state()
            history = [b for b in ([state.committed] if state.committed else []) + state.history if b != bundle_id]
            versions = dict(state.versions)
            if raise_floor:
                versions = merge_floors(versions, {model_name: model_version})
            owed = [*state.unannounced, notice] if notice else state.unannounced
            state = AgentState(
                committed=bundle_id, history=history[: self.keep_previous], versions=versions, refused=state.refused,
                unannounced=owed[-MAX_UNANNOUNCED:],
            )  # fmt: skip
            self.save_state(state)
            if raise_floor:
                self._hold_floor(self.load_state().versions, bundle_id, model_name, model_version)
            self._prune(state)
            return self.load_state()

    def mark_announced(self, notice: CommitNotice) -> None:
        """The event `notice` stood for is in the spool now (a read-modify-write: other notices may have come)."""
        with self._lock:
            state = self.load_state()
            if notice in state.unannounced:
                self.save_state(state.model_copy(update={"unannounced": [n for n in state.unannounced if n != notice]}))

    def remember_refusal(self, key: str, keep: int = 100) -> None:
        with self._lock:
            state = self.load_state()
            if key not in state.refused:
                self.save_state(state.model_copy(update={"refused": [*state.refused, key][-keep:]}))

    def forget(self) -> list[str]:
        """A signed removal of the slot: it runs nothing from now on, and the bundles no other slot keeps are
        deleted. Its version floor stays (a removal never lowers what the slot may later be given)."""
        with self._lock:
            state = self.load_state()
            kept = {state.committed, *state.history} - {None}
            self.save_state(AgentState(versions=state.versions, refused=state.refused))
            (self.slot_dir / "current").unlink(missing_ok=True)
            shutil.rmtree(self.downloads, ignore_errors=True)
            self.downloads.mkdir(parents=True, exist_ok=True)
            self._prune(self.load_state())
            return sorted(b for b in kept if b and not self.bundle_dir(b).exists())

    def _kept_by_slots(self) -> set[str]:
        """Every bundle some slot's state keeps (committed or history)."""
        keep: set[str] = set()
        for path in (self.root / SLOTS_DIR).glob("*/state.json"):
            try:
                other = AgentState.model_validate_json(path.read_bytes())
            except (OSError, ValueError):
                continue
            keep |= {b for b in (other.committed, *other.history) if b}
        return keep

    def _prune(self, state: AgentState) -> None:
        keep = {state.committed, *state.history} | self._kept_by_slots()
        for path in self.bundles.iterdir():
            if path.is_dir() and not path.name.endswith(".staging") and path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)
        for part in self.downloads.iterdir():
            if part.name.split(".part")[0] in keep:
                part.unlink(missing_ok=True)
