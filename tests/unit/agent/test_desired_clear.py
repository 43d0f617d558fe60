"""Clearing desired state on the device (agent/install/desired.py), with the device's real store and trust on disk:
an empty message changes nothing, a signed clear clears, and an accepted document outlives a restart even when the
broker no longer holds it. The same on real agents and the shipped secure broker:
tests/e2e/attacks/test_attack_broker_desired.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.agent.install.desired import DesiredRefused, DesiredState
from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.signing import device_target, group_target, sign_desired
from edgefleet.core.messages import Desired
from edgefleet.core.trust.signing import TrustedKeys

V3 = Desired(bundle_id="m-3", model_name="m", model_version="3", profile="generic-x86-64")
V4 = Desired(bundle_id="m-4", model_name="m", model_version="4", profile="generic-x86-64")
CLEAR = Desired(bundle_id="", model_name="", model_version="", profile="", clear=True)


@pytest.fixture
def keys(tmp_path: Path) -> keyring.HostKeys:
    keyring.init(tmp_path / "keys")
    return keyring.HostKeys(tmp_path / "keys")


def device(keys: keyring.HostKeys, root: Path) -> DesiredState:
    store = Store(root)
    return DesiredState("d1", ["lab"], DeviceTrust(TrustedKeys.load([keys.root_public()]), store), store)


def test_an_empty_message_is_refused_and_the_document_in_force_stays(keys: keyring.HostKeys, tmp_path: Path) -> None:
    state = device(keys, tmp_path / "d1")
    state.on_message("device", None, "default", sign_desired(keys, V3, device_target("d1")).encode())
    state.on_message("group", "lab", "default", sign_desired(keys, V4, group_target("lab")).encode())
    for scope, group in (("device", None), ("group", "lab")):
        with pytest.raises(DesiredRefused, match="a clear must be a signed document"):
            state.on_message(scope, group, "default", b"")  # type: ignore[arg-type]
    effective = state.effective()
    assert effective is not None and effective.bundle_id == "m-3" and state.refusals == 2


def test_accepted_documents_outlive_a_restart_and_only_a_signed_clear_clears(
    keys: keyring.HostKeys, tmp_path: Path
) -> None:
    state = device(keys, tmp_path / "d1")
    state.on_message("device", None, "default", sign_desired(keys, V3, device_target("d1")).encode())
    state.on_message("group", "lab", "default", sign_desired(keys, V4, group_target("lab")).encode())
    again = device(keys, tmp_path / "d1")  # a restart: nothing from the broker yet (or ever: it was cleared)
    effective = again.effective()
    assert effective is not None and effective.bundle_id == "m-3"
    again.on_message("device", None, "default", sign_desired(keys, CLEAR, device_target("d1")).encode())
    effective = again.effective()
    assert effective is not None and effective.bundle_id == "m-4", "the group's document applies"
    third = device(keys, tmp_path / "d1")  # the signed clear is kept too
    effective = third.effective()
    assert effective is not None and effective.bundle_id == "m-4"
    third.on_message("group", "lab", "default", sign_desired(keys, CLEAR, group_target("lab")).encode())
    assert third.effective() is None and third.stale() is None  # no desired state: the device keeps what it runs


def test_a_kept_document_is_verified_again_at_start_up(keys: keyring.HostKeys, tmp_path: Path) -> None:
    state = device(keys, tmp_path / "d1")
    state.on_message("device", None, "default", sign_desired(keys, V3, device_target("d1")).encode())
    kept = tmp_path / "d1" / "trust" / "desired" / "default" / "device.json"
    kept.write_bytes(kept.read_bytes().replace(b"m-3", b"m-9"))  # edited on disk: its signature no longer holds
    assert device(keys, tmp_path / "d1").effective() is None
