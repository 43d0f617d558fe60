"""Key roles: root delegates bundle and ops keys in a versioned, expiring key set; devices never go back."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.control.credentials import keyring
from edgefleet.core.errors import SignatureError, UserInputError
from edgefleet.core.messages import Transfer
from edgefleet.core.transfer.blocks import LayoutError, check_layout
from edgefleet.core.trust.keyset import sign_payload, verify_keyset, verify_payload
from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair

HASH = "0" * 64


@pytest.fixture
def fleet_keys(tmp_path: Path) -> keyring.HostKeys:
    keyring.init(tmp_path / "keys")
    return keyring.HostKeys(tmp_path / "keys")


def root_of(keys: keyring.HostKeys) -> TrustedKeys:
    return TrustedKeys.load([keys.root_public()])


def test_init_writes_private_keys_0600_and_a_key_set_delegating_both_roles(fleet_keys: keyring.HostKeys) -> None:
    for name in ("root", "bundle", "ops"):
        assert stat.S_IMODE((fleet_keys.directory / f"{name}.key").stat().st_mode) == 0o600
    keyset = verify_keyset(fleet_keys.keyset(), root_of(fleet_keys))
    assert keyset.version == 1
    assert keyset.trusted("bundle").ids == [fleet_keys.bundle_key().key_id]
    assert keyset.trusted("ops").ids == [fleet_keys.ops_key().key_id]


def test_a_key_set_not_signed_by_root_or_expired_is_refused(fleet_keys: keyring.HostKeys) -> None:
    signed = fleet_keys.keyset()
    with pytest.raises(SignatureError, match="untrusted key"):
        verify_keyset(signed.model_copy(update={"key_id": fleet_keys.ops_key().key_id}), root_of(fleet_keys))
    forged = sign_payload("keyset", signed.payload, fleet_keys.ops_key())
    with pytest.raises(SignatureError):
        verify_keyset(forged, root_of(fleet_keys))
    with pytest.raises(SignatureError, match="expired"):
        verify_keyset(signed, root_of(fleet_keys), now=json.loads(signed.payload)["expires_at"] + 1)


def test_signatures_are_domain_separated(fleet_keys: keyring.HostKeys) -> None:
    """A root-signed key set can never pass as a desired document, even if root signed both."""
    signed = fleet_keys.keyset()
    as_desired = signed.model_copy(update={"kind": "desired"})
    with pytest.raises(SignatureError):
        verify_payload("desired", as_desired, root_of(fleet_keys))


def test_rotation_and_revocation_make_new_versions_and_keep_revoked_ids(fleet_keys: keyring.HostKeys) -> None:
    directory = fleet_keys.directory
    old_bundle = fleet_keys.bundle_key().key_id
    keyring.rotate(directory, "bundle")
    assert (directory / "retired" / f"bundle-{old_bundle}.key").exists()
    new_bundle = fleet_keys.bundle_key().key_id
    info = keyring.revoke(directory, fleet_keys.ops_key().key_id)  # a current key: rotated in the same step
    assert info["keyset_version"] == 3
    assert new_bundle in info["roles"]["bundle"] and old_bundle not in info["roles"]["bundle"]
    assert info["revoked"] and info["revoked"][0] not in info["roles"]["ops"]
    keyring.revoke(directory, old_bundle)
    assert set(keyring.show(directory)["revoked"]) == {info["revoked"][0], old_bundle}


def test_the_desired_state_counter_only_grows_across_processes(fleet_keys: keyring.HostKeys) -> None:
    first = fleet_keys.next_counter()
    (fleet_keys.directory / keyring.COUNTER_NAME).write_text(str(first + 10**9))  # a clock that went back
    code = (
        "import sys, pathlib; from edgefleet.control.credentials.keyring import HostKeys; "
        "print(HostKeys(pathlib.Path(sys.argv[1])).next_counter())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(fleet_keys.directory)], capture_output=True, text=True)
    assert int(out.stdout) == first + 10**9 + 1
    assert fleet_keys.next_counter() == first + 10**9 + 2


def test_a_device_adopts_only_newer_root_signed_key_sets_and_keeps_them(
    fleet_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    store = Store(tmp_path / "device")
    v1 = fleet_keys.keyset()
    trust = DeviceTrust(root_of(fleet_keys), store)
    assert trust.consider(v1) and trust.version == 1
    keyring.rotate(fleet_keys.directory, "bundle")
    v2 = fleet_keys.keyset()
    assert trust.consider(v2) and trust.version == 2
    assert not trust.consider(v1), "an older key set is ignored"
    assert trust.keys("bundle").ids == [fleet_keys.bundle_key().key_id]
    stranger = SigningKey.load(generate_keypair(tmp_path / "x", "root")[0])
    with pytest.raises(SignatureError):
        trust.consider(sign_payload("keyset", v2.payload.replace('"version":2', '"version":9'), stranger))
    again = DeviceTrust(root_of(fleet_keys), store)  # a restart
    assert again.version == 2


def test_a_device_without_a_key_set_trusts_no_role_key(fleet_keys: keyring.HostKeys, tmp_path: Path) -> None:
    trust = DeviceTrust(root_of(fleet_keys), Store(tmp_path / "device"))
    with pytest.raises(SignatureError, match="no root-signed key set"):
        trust.keys("bundle")


@pytest.mark.parametrize(
    ("transfer", "reason"),
    [
        (Transfer(size=10_000, sha256=HASH, block_size=4096, block_sha256=[HASH] * 2), "impossible layout"),
        (Transfer(size=10_000, sha256=HASH, block_size=4096, block_sha256=[HASH] * 4), "impossible layout"),
        (Transfer(size=10**9, sha256=HASH, block_size=2**20, block_sha256=[HASH] * 954), "allows"),
        (Transfer(size=2**25, sha256=HASH, block_size=2**25, block_sha256=[HASH]), "block size"),
        (Transfer(size=4096, sha256=HASH, block_size=4096, block_sha256=["zz" * 32]), "not sha256"),
    ],
)
def test_impossible_or_oversized_layouts_are_refused(transfer: Transfer, reason: str) -> None:
    with pytest.raises(LayoutError, match=reason):
        check_layout(transfer, size_limit=500_000_000)


def test_a_layout_that_fits_passes() -> None:
    check_layout(Transfer(size=10_000, sha256=HASH, block_size=4096, block_sha256=[HASH] * 3), size_limit=10_000)


def test_keys_commands_init_rotate_revoke_show(tmp_path: Path) -> None:
    def keys(*args: str) -> dict:
        cmd = [sys.executable, "-m", "edgefleet", "keys", *args, "--dir", str(tmp_path / "k"), "--json"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    first = keys("init")
    assert first["keyset_version"] == 1 and set(first["roles"]) == {"bundle", "ops", "release"}
    rotated = keys("rotate", "--role", "ops")
    assert rotated["keyset_version"] == 2 and rotated["roles"]["ops"] != first["roles"]["ops"]
    revoked = keys("revoke", first["roles"]["bundle"][0])
    assert first["roles"]["bundle"][0] in revoked["revoked"]
    assert keys("show")["keyset_version"] == 3


def test_a_missing_key_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="keys init"):
        keyring.HostKeys(tmp_path).ops_key()


def test_a_new_expired_key_set_is_refused_and_the_one_held_stays(fleet_keys: keyring.HostKeys, tmp_path: Path) -> None:
    trust = DeviceTrust(root_of(fleet_keys), Store(tmp_path / "device"))
    assert trust.consider(fleet_keys.keyset())
    keyring.delegate(fleet_keys.directory, days=-1)  # version 2, already expired
    with pytest.raises(SignatureError, match="expired"):
        trust.consider(fleet_keys.keyset())
    assert trust.version == 1 and trust.keys("ops").ids == [fleet_keys.ops_key().key_id]
