"""Agent releases (core/release/): what a device accepts before it installs one, and what it refuses.

A release is signed by the release role the key set delegates; a forged or edited manifest, a wheel that is not its
pin, a key of another role, a document that names another release, another platform, or a version below the
device's agent floor without a signed downgrade naming it exactly: each is refused with its reason.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from edgefleet.control.credentials import keyring
from edgefleet.core.errors import SignatureError
from edgefleet.core.messages import AgentRelease, Transfer
from edgefleet.core.release import (
    ReleaseError,
    ReleaseRefused,
    build_release,
    check_release_ref,
    parse_release_manifest,
    read_release,
    release_offer_bytes,
    sign_release_offer,
    unpack_release,
    verify_release_file,
    verify_release_offer,
)
from edgefleet.core.transfer.blocks import offer_signing_bytes
from edgefleet.core.trust.keyset import verify_keyset
from edgefleet.core.trust.signing import SigningKey, TrustedKeys


@pytest.fixture
def keys(tmp_path: Path) -> keyring.HostKeys:
    keyring.init(tmp_path / "keys")
    return keyring.HostKeys(tmp_path / "keys")


def _role(keys: keyring.HostKeys, role: str) -> TrustedKeys:
    keyset = verify_keyset(keys.keyset(), TrustedKeys.load([keys.root_public()]))
    return keyset.trusted(role)  # type: ignore[arg-type]


def _wheels(directory: Path, version: str = "0.2.0") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"edgefleet-{version}-py3-none-any.whl").write_bytes(b"the agent " * 500)
    (directory / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"a dependency " * 900)
    return directory


def _release(tmp_path: Path, keys: keyring.HostKeys, version: str = "0.2.0", key: SigningKey | None = None) -> Path:
    out = tmp_path / f"agent-{version}.release"
    build_release(_wheels(tmp_path / f"wheels-{version}", version), version, key or keys.release_key(), out)
    return out


def _rewrite(source: Path, out: Path, change: dict[str, bytes]) -> Path:
    """The same tar with some members' bytes replaced (an attacker's edit; the signature is kept)."""
    with tarfile.open(source) as tar, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as new:
        for member in tar:
            data = change.get(member.name) or tar.extractfile(member).read()  # type: ignore[union-attr]
            member.size = len(data)
            new.addfile(member, io.BytesIO(data))
    return out


def test_keys_init_delegates_a_release_role_besides_bundle_and_ops(keys: keyring.HostKeys) -> None:
    shown = keyring.show(keys.directory)
    assert set(shown["roles"]) == {"bundle", "ops", "release"}
    assert keys.release_key().key_id in shown["roles"]["release"]


def test_a_release_signed_by_the_release_key_verifies_with_every_pin(tmp_path: Path, keys: keyring.HostKeys) -> None:
    manifest = verify_release_file(_release(tmp_path, keys), _role(keys, "release"))
    assert manifest.version == "0.2.0" and manifest.install_spec == "edgefleet[cpu]==0.2.0"
    assert {f.name.split("-")[0] for f in manifest.files} == {"edgefleet", "numpy"}


def test_a_forged_manifest_is_refused(tmp_path: Path, keys: keyring.HostKeys) -> None:
    release = _release(tmp_path, keys)
    text = read_release(release).manifest_json.replace('"0.2.0"', '"0.9.0"')
    forged = _rewrite(release, tmp_path / "forged.release", {"release.json": text.encode()})
    with pytest.raises(SignatureError, match="does not verify"):
        verify_release_file(forged, _role(keys, "release"))


def test_a_wheel_that_is_not_its_pin_is_refused(tmp_path: Path, keys: keyring.HostKeys) -> None:
    release = _release(tmp_path, keys)
    name = "wheels/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"
    tampered = _rewrite(release, tmp_path / "tampered.release", {name: b"A dependency " * 900})
    with pytest.raises(ReleaseError, match="does not match its sha256 pin"):
        verify_release_file(tampered, _role(keys, "release"))
    manifest_json = read_release(tampered).manifest_json
    with pytest.raises(ReleaseError, match="sha256"):
        unpack_release(tampered, tmp_path / "unpacked", manifest_json)
    assert not (tmp_path / "unpacked").exists()


def test_an_extra_member_is_refused_on_unpack(tmp_path: Path, keys: keyring.HostKeys) -> None:
    release = _release(tmp_path, keys)
    with tarfile.open(release, "a") as tar:
        info = tarfile.TarInfo("wheels/evil-1.0-py3-none-any.whl")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(ReleaseError, match="unexpected member"):
        unpack_release(release, tmp_path / "unpacked", read_release(release).manifest_json)


def test_a_release_signed_by_another_roles_key_is_refused(tmp_path: Path, keys: keyring.HostKeys) -> None:
    for role_key in (keys.bundle_key(), keys.ops_key()):
        release = _release(tmp_path / role_key.key_id, keys, key=role_key)
        with pytest.raises(SignatureError, match="untrusted key"):
            verify_release_file(release, _role(keys, "release"))


def test_the_offer_signature_is_bound_to_the_release_role_and_domain(tmp_path: Path, keys: keyring.HostKeys) -> None:
    release = _release(tmp_path, keys)
    manifest_json = read_release(release).manifest_json
    transfer = Transfer(size=release.stat().st_size, sha256="0" * 64, block_size=128 * 1024, block_sha256=["1" * 64])
    offer = sign_release_offer("agent-0.2.0-x", manifest_json, transfer, keys.release_key(), keys.keyset())
    verify_release_offer(offer, _role(keys, "release"))
    with pytest.raises(SignatureError):  # a bundle key cannot have signed it
        verify_release_offer(offer, _role(keys, "bundle"))
    moved = offer.model_copy(update={"transfer": transfer.model_copy(update={"size": transfer.size + 1})})
    with pytest.raises(SignatureError, match="does not verify"):  # the layout is under the signature
        verify_release_offer(moved, _role(keys, "release"))
    # the same key's signature over a bundle offer's bytes never passes for a release offer (domain separation)
    assert release_offer_bytes("x", manifest_json, transfer) != offer_signing_bytes("x", manifest_json, transfer)
    as_bundle = offer.model_copy(
        update={"signature": keys.release_key().sign(offer_signing_bytes(offer.release_id, manifest_json, transfer))}
    )
    with pytest.raises(SignatureError):
        verify_release_offer(as_bundle, _role(keys, "release"))


def _offer_for(tmp_path: Path, keys: keyring.HostKeys, version: str):  # type: ignore[no-untyped-def]
    release = _release(tmp_path, keys, version)
    manifest_json = read_release(release).manifest_json
    manifest = parse_release_manifest(manifest_json)
    transfer = Transfer(size=1, sha256="0" * 64, block_size=1024, block_sha256=["1" * 64])
    return manifest, sign_release_offer(manifest.release_id, manifest_json, transfer, keys.release_key(), None)


def test_a_version_below_the_floor_needs_a_signed_downgrade_naming_it(tmp_path: Path, keys: keyring.HostKeys) -> None:
    manifest, offer = _offer_for(tmp_path, keys, "0.2.0")
    wanted = AgentRelease(release_id=manifest.release_id, version="0.2.0")
    check_release_ref(manifest, offer, wanted, floor="0.1.0")  # newer: fine
    for floor in ("0.2.0", "0.3.0"):
        with pytest.raises(ReleaseRefused, match="not newer than"):
            check_release_ref(manifest, offer, wanted, floor=floor)
    other = wanted.model_copy(update={"allow_downgrade_to": "agent-0.1.0-py311-linux-x86_64"})
    with pytest.raises(ReleaseRefused, match="not newer than"):
        check_release_ref(manifest, offer, other, floor="0.3.0")
    named = wanted.model_copy(update={"allow_downgrade_to": manifest.release_id})
    check_release_ref(manifest, offer, named, floor="0.3.0")


def test_the_offer_must_be_the_documents_release_for_this_platform(tmp_path: Path, keys: keyring.HostKeys) -> None:
    manifest, offer = _offer_for(tmp_path, keys, "0.2.0")
    with pytest.raises(ReleaseRefused, match="not the desired"):
        check_release_ref(manifest, offer, AgentRelease(release_id="agent-0.2.1-x", version="0.2.0"), floor="0.1")
    with pytest.raises(ReleaseRefused, match=r"not 0\.2\.1"):
        check_release_ref(manifest, offer, AgentRelease(release_id=manifest.release_id, version="0.2.1"), floor="0")
    arm = manifest.model_copy(update={"platform": "linux-aarch64"})
    with pytest.raises(ReleaseRefused, match="linux-aarch64"):
        check_release_ref(arm, offer, AgentRelease(release_id=manifest.release_id, version="0.2.0"), floor="0")


def test_a_manifest_without_the_agents_own_wheel_is_refused(tmp_path: Path, keys: keyring.HostKeys) -> None:
    wheels = _wheels(tmp_path / "w", "0.2.0")
    with pytest.raises(ReleaseError, match=r"no edgefleet 0\.3\.0 wheel"):
        build_release(wheels, "0.3.0", keys.release_key(), tmp_path / "x.release")


def test_the_same_wheels_make_the_same_member_bytes(tmp_path: Path, keys: keyring.HostKeys) -> None:
    """Deterministic members: an unchanged dependency wheel lands in the same bytes, so in the same chunks."""
    first, second = _release(tmp_path / "a", keys, "0.2.0"), _release(tmp_path / "b", keys, "0.2.1")
    dep = "wheels/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"

    def member(path: Path) -> bytes:
        with tarfile.open(path) as tar:
            info = tar.getmember(dep)
        with path.open("rb") as handle:
            handle.seek(info.offset)
            return handle.read(info.offset_data - info.offset + info.size)

    assert member(first) == member(second)
