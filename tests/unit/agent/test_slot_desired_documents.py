"""Signed desired state per slot on the device (agent/install/desired.py), with the device's real store and trust on
disk: a document holds only on its own slot's topic, counters are per (target, slot), resolution is per slot, and a
single-model agent's counters and kept document count for slot "default" (agent/install/migration.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefleet.agent.install.desired import DesiredRefused, DesiredState
from edgefleet.agent.install.migration import migrate_single_model
from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.signing import device_target, group_target, sign_desired
from edgefleet.core.messages import Desired
from edgefleet.core.trust.signing import TrustedKeys


def doc(slot: str, bundle: str, version: str = "1") -> Desired:
    return Desired(slot=slot, bundle_id=bundle, model_name=bundle.split("-")[0], model_version=version,
                   profile="generic-x86-64")  # fmt: skip


@pytest.fixture
def keys(tmp_path: Path) -> keyring.HostKeys:
    keyring.init(tmp_path / "keys")
    return keyring.HostKeys(tmp_path / "keys")


def device(keys: keyring.HostKeys, root: Path) -> DesiredState:
    store = Store(root)
    return DesiredState("d1", ["lab", "site"], DeviceTrust(TrustedKeys.load([keys.root_public()]), store), store)


def signed(keys: keyring.HostKeys, desired: Desired, target: str) -> bytes:
    return sign_desired(keys, desired, target).encode()


def test_a_document_holds_only_on_its_own_slots_topic(keys: keyring.HostKeys, tmp_path: Path) -> None:
    state = device(keys, tmp_path / "d1")
    payload = signed(keys, doc("detector", "det-1"), device_target("d1"))
    with pytest.raises(DesiredRefused, match="for slot 'detector', not 'assistant'"):
        state.on_message("device", None, "assistant", payload)
    state.on_message("device", None, "detector", payload)
    assert state.effective("assistant") is None and state.slots() == ["detector"]
    assert (found := state.effective("detector")) is not None and found.bundle_id == "det-1"


def test_resolution_counters_and_floors_are_per_slot(keys: keyring.HostKeys, tmp_path: Path) -> None:
    state = device(keys, tmp_path / "d1")
    state.on_message("group", "site", "detector", signed(keys, doc("detector", "det-1"), group_target("site")))
    state.on_message("group", "lab", "assistant", signed(keys, doc("assistant", "asst-1"), group_target("lab")))
    state.on_message("device", None, "assistant", signed(keys, doc("assistant", "asst-2"), device_target("d1")))
    # each slot resolves on its own: the device override of one slot leaves the other's group document in force
    assert state.effective("detector").bundle_id == "det-1"  # type: ignore[union-attr]
    assert state.effective("assistant").bundle_id == "asst-2"  # type: ignore[union-attr]
    counters = json.loads((tmp_path / "d1" / "trust" / "counters.json").read_text())
    assert set(counters) == {"group:site@detector", "group:lab@assistant", "device:d1@assistant"}
    again = device(keys, tmp_path / "d1")  # and after a restart
    assert again.effective("assistant").bundle_id == "asst-2"  # type: ignore[union-attr]
    assert again.effective("detector").bundle_id == "det-1"  # type: ignore[union-attr]


def test_a_replayed_document_of_one_slot_is_refused_and_never_blocks_another(
    keys: keyring.HostKeys, tmp_path: Path
) -> None:
    state = device(keys, tmp_path / "d1")
    first = signed(keys, doc("detector", "det-1"), device_target("d1"))
    second = signed(keys, doc("detector", "det-2"), device_target("d1"))  # signed later: a higher counter
    state.on_message("device", None, "detector", second)
    with pytest.raises(DesiredRefused, match="replayed desired document"):
        state.on_message("device", None, "detector", first)
    state.on_message("device", None, "assistant", signed(keys, doc("assistant", "asst-1"), device_target("d1")))
    assert state.effective("assistant") is not None


def test_a_single_model_agents_document_and_counters_count_for_the_default_slot(
    keys: keyring.HostKeys, tmp_path: Path
) -> None:
    root = tmp_path / "d1"
    older = signed(keys, doc("default", "digits-0"), device_target("d1"))
    old = signed(keys, doc("default", "digits-1"), device_target("d1"))
    newer = signed(keys, doc("default", "digits-2"), device_target("d1"))
    device(keys, root).on_message("device", None, "default", old)
    # rewrite into the single-model layout: the document at the top of trust/desired, counters without a slot
    (root / "trust" / "desired" / "default" / "device.json").rename(root / "trust" / "desired" / "device.json")
    (root / "trust" / "desired" / "default").rmdir()
    counters = json.loads((root / "trust" / "counters.json").read_text())
    (root / "trust" / "counters.json").write_text(json.dumps({k.split("@")[0]: v for k, v in counters.items()}))
    assert migrate_single_model(root) == ["trust/desired/device.json"]
    upgraded = device(keys, root)
    assert upgraded.effective("default").bundle_id == "digits-1"  # type: ignore[union-attr]
    with pytest.raises(DesiredRefused, match="replayed desired document"):  # the counter kept its value
        upgraded.on_message("device", None, "default", older)
    upgraded.on_message("device", None, "default", newer)
    assert upgraded.effective("default").bundle_id == "digits-2"  # type: ignore[union-attr]
