"""Device state hygiene: a version floor that never goes down, one serialized writer, pruned leftovers, and a
full disk that is a transient refusal (real tmpfs mounts, real kill -9)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefleet.agent.install.store import Store
from edgefleet.core.bundle.archive import read_signed_manifest, unpack_pinned
from edgefleet.core.errors import BundleError, DiskFullError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to, padded_bundle
from support.paths import REPO
from support.servers.brokers import MosquittoBroker
from support.slots import slot_of


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        path = tmp_path / f"tmpfs-{len(mounted)}"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _staged(store: Store, bundle_id: str) -> None:
    store.staging_dir(bundle_id).mkdir(parents=True)


def test_a_local_rollback_or_fallback_never_lowers_the_floor(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for version in ("1", "2", "3"):
        _staged(store, f"m-{version}")
        store.commit(f"m-{version}", "m", version)
    store.commit("m-2", "m", "2", raise_floor=False)  # the device's own rollback
    assert store.load_state().committed == "m-2"
    assert store.floor() == {"m": "3"}
    store.commit("m-1", "m", "1")  # even a commit that claims to raise it cannot lower it
    assert store.floor() == {"m": "3"}


@pytest.mark.parametrize("damage", ["delete", "corrupt", "reset"])
def test_the_floor_survives_losing_state_json(tmp_path: Path, damage: str) -> None:
    store = Store(tmp_path)
    _staged(store, "m-7")
    store.commit("m-7", "m", "7")
    state = tmp_path / "slots" / "default" / "state.json"
    if damage == "delete":
        state.unlink()
    elif damage == "corrupt":
        state.write_text("{garbage")
    else:
        state.write_text(json.dumps({"schema_version": 1, "versions": {}}))
    assert Store(tmp_path).floor() == {"m": "7"}


def test_the_floor_survives_losing_its_second_copy(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _staged(store, "m-4")
    store.commit("m-4", "m", "4")
    (tmp_path / "slots" / "default" / "floor.json").write_text("not json")
    assert Store(tmp_path).floor() == {"m": "4"}


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    """The install thread and the health thread both write state: every refusal recorded, none lost."""
    store = Store(tmp_path)

    def refuse(prefix: str) -> None:
        for index in range(40):
            store.remember_refusal(f"{prefix}-{index}@1")

    threads = [threading.Thread(target=refuse, args=(p,)) for p in ("install", "health", "other")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.load_state().refused) == 100  # the store keeps the latest 100 of the 120
    assert len(set(store.load_state().refused)) == 100


def test_abandoned_downloads_and_staging_are_pruned(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for name in ("old.part", "old.part.blocks", "old.part.meta", "cur.part", "cur.part.blocks", "new.part"):
        (store.downloads / name).write_bytes(b"x")
    stale = time.time() - 10 * 86400
    for name in ("old.part", "old.part.blocks", "old.part.meta"):
        os.utime(store.downloads / name, (stale, stale))
    _staged(store, "crashed")
    removed = store.clean_incomplete()
    assert "crashed.staging" in removed and "downloads/old.part.meta" in removed
    assert sorted(p.name for p in store.downloads.iterdir()) == ["cur.part", "cur.part.blocks", "new.part"]
    assert store.prune_downloads(keep="cur") == ["new.part"]
    assert sorted(p.name for p in store.downloads.iterdir()) == ["cur.part", "cur.part.blocks"]


def test_a_full_disk_while_unpacking_is_disk_full_not_a_corrupt_bundle(
    tmpfs: Callable[[str], Path], tmp_path: Path, demo_bundles: dict[str, Path], signing_key: SigningKey,
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    big = padded_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, TrustedKeys.load([keys[1]]),
                        version="2", pad_bytes=3 * 2**20)  # fmt: skip
    text = read_signed_manifest(big).manifest_json
    small_disk = tmpfs("1m")
    with pytest.raises(DiskFullError, match="disk full"):
        unpack_pinned(big, small_disk / "staging", text)
    assert not (small_disk / "staging").exists(), "a failed unpack leaves nothing behind"
    with pytest.raises(BundleError, match="differs from the signed offer"):
        unpack_pinned(big, tmp_path / "other", text.replace('"2"', '"3"', 1))
    manifest = unpack_pinned(big, tmp_path / "ok", text)
    assert (tmp_path / "ok" / "extra" / "padding.bin").stat().st_size == 3 * 2**20 and manifest.model_version == "2"


@pytest.mark.slow
def test_a_disk_that_fills_during_an_install_is_retried_once_space_returns(
    tmpfs: Callable[[str], Path], tmp_path: Path, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], signing_key: SigningKey, keys: tuple[Path, Path], mosquitto: MosquittoBroker,
    root_pub: Path,
) -> None:  # fmt: skip
    state = tmpfs("48m")
    agent = AgentProcess("dev-filling", state, broker=mosquitto.url, trust=root_pub).start()
    try:
        big = padded_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, TrustedKeys.load([keys[1]]),
                            version="2", pad_bytes=8 * 2**20)  # fmt: skip
        bundle_id = deploy_to(host, topics, big, devices=("dev-filling",), block_size=4096)
        watcher.event("dev-filling", "download-started", bundle_id=bundle_id, timeout=60)
        filler = state / "filler"
        with filler.open("wb") as handle:  # fill the disk (to its last 64 KiB) while the install runs
            while os.statvfs(state).f_bavail * os.statvfs(state).f_frsize > 64 * 1024:
                try:
                    handle.write(b"\0" * 32 * 1024)
                    handle.flush()
                except OSError:
                    break
        # While the disk is full even the event spool cannot write: the retained status says what happened.
        status = watcher.wait_for(
            "the install failing on the full disk",
            lambda: (
                (st := watcher.status.get("dev-filling")) and (e := slot_of(st).last_error) and bundle_id in e and st
            ),
            timeout=90,
        )
        error = slot_of(status).last_error
        assert "retrying" in str(error), f"a full disk must be transient: {error}"
        assert slot_of(status).active_bundle != bundle_id
        filler.unlink()  # space returns
        watcher.serving("dev-filling", bundle_id, timeout=90)
        refused = [e for e in watcher.events if e.bundle_id == bundle_id and e.kind in ("refused", "rolled-back")]
        assert not refused and agent.alive
    finally:
        agent.stop()


_CHILD = r"""
import sys, pathlib
from edgefleet.agent.install import Store
store = Store(pathlib.Path(sys.argv[1]))
version = int(sys.argv[2])
while True:
    version += 1
    bundle = f"m-{version}"
    store.staging_dir(bundle).mkdir(parents=True, exist_ok=True)
    (store.staging_dir(bundle) / "model.bin").write_bytes(b"x" * 4096)
    store.commit(bundle, "m", str(version))                        # an install: raises the floor
    print(version, flush=True)
    history = store.load_state().history
    if history:
        store.commit(history[0], "m", history[0].split("-")[1], raise_floor=False)  # a local rollback
    store.remember_refusal(f"{bundle}@{version}")
"""


@pytest.mark.slow
def test_kill_9_during_every_state_write_never_lowers_the_floor(tmp_path: Path) -> None:
    """A real process commits, rolls back and records refusals in a loop; it is killed with SIGKILL at random
    moments (inside commit, rollback, floor and state writes). After each kill the floor read back by a fresh
    Store is at least the highest version whose commit had returned."""
    rng = random.Random(10)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    highest, kills = 0, 0
    for _ in range(30):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "state"), str(highest)],
                                 stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert child.stdout is not None
        first = child.stdout.readline()  # started: at least one commit returned
        assert first.strip().isdigit(), "the child never committed"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=30)
        kills += 1
        committed = [int(line) for line in [first, *out.splitlines()] if line.strip().isdigit()]
        highest = max(highest, *committed)
        floor = int(Store(tmp_path / "state").floor()["m"])
        assert floor >= highest, f"floor {floor} fell below the committed {highest} after kill {kills}"
        highest = floor
    print(json.dumps({"kills": kills, "final_floor": highest}))
