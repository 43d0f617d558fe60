"""The bundle file: signed, pinned by hashes, and unpacked without ever escaping its directory."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from edgefleet.core.bundle.archive import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    parse_manifest,
    read_signed_manifest,
    unpack_bundle,
    verify_bundle,
)
from edgefleet.core.errors import BundleError, SignatureError
from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair


def _rewrite(bundle: Path, out: Path, edit: dict[str, bytes | None], extra: tuple[tarfile.TarInfo, ...] = ()) -> Path:
    """Copy a bundle, replacing (bytes) or dropping (None) members by name, then appending `extra`."""
    with tarfile.open(bundle) as src, tarfile.open(out, "w") as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name in edit:
                if edit[member.name] is None:
                    continue
                data = edit[member.name]  # type: ignore[assignment]
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
        for info in extra:
            dst.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return out


@pytest.fixture
def bundle(demo_bundles: dict[str, Path]) -> Path:
    return demo_bundles["intel-x86-vnni"]


def test_a_bundle_verifies_against_the_key_that_signed_it(bundle: Path, trusted: TrustedKeys) -> None:
    manifest = verify_bundle(bundle, trusted)
    assert manifest.profile == "intel-x86-vnni"
    assert {f.path for f in manifest.files} == {"model/model.onnx", "golden.npz", "drift_reference.json"}
    assert manifest.accuracy.passed and manifest.accuracy.value >= 0.95


def test_unpacking_writes_exactly_the_pinned_files(bundle: Path, trusted: TrustedKeys, tmp_path: Path) -> None:
    manifest = unpack_bundle(bundle, tmp_path / "x", trusted)
    written = sorted(str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x").rglob("*") if p.is_file())
    assert written == sorted(f.path for f in manifest.files)


def test_an_untrusted_key_is_refused(bundle: Path, tmp_path: Path) -> None:
    _, other_public = generate_keypair(tmp_path, "other")
    with pytest.raises(SignatureError, match="untrusted key"):
        verify_bundle(bundle, TrustedKeys.load([other_public]))


def test_a_tampered_manifest_fails_the_signature(bundle: Path, trusted: TrustedKeys, tmp_path: Path) -> None:
    manifest = json.loads(read_signed_manifest(bundle).manifest_json)
    manifest["model_version"] = "99"
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {MANIFEST_NAME: json.dumps(manifest).encode()})
    with pytest.raises(SignatureError, match="does not verify"):
        verify_bundle(bad, trusted)


def test_a_tampered_model_fails_its_hash(bundle: Path, trusted: TrustedKeys, tmp_path: Path) -> None:
    with tarfile.open(bundle) as tar:
        model = tar.extractfile("model/model.onnx").read()  # type: ignore[union-attr]
    flipped = model[:-1] + bytes([model[-1] ^ 1])
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {"model/model.onnx": flipped})
    with pytest.raises(BundleError, match="sha256 does not match"):
        verify_bundle(bad, trusted)
    with pytest.raises(BundleError):
        unpack_bundle(bad, tmp_path / "out", trusted)
    assert not (tmp_path / "out").exists(), "a failed unpack leaves nothing behind"


def test_a_missing_file_is_refused(bundle: Path, trusted: TrustedKeys, tmp_path: Path) -> None:
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {"golden.npz": None})
    with pytest.raises(BundleError, match=r"missing pinned files: golden\.npz"):
        verify_bundle(bad, trusted)


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/evil", "model/../../escape"])
def test_entries_outside_the_bundle_are_refused(bundle: Path, trusted: TrustedKeys, tmp_path: Path, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.size = 1
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {}, (info,))
    with pytest.raises(BundleError, match="does not pin"):
        unpack_bundle(bad, tmp_path / "out" / "x", trusted)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "out" / "x").exists()


def test_links_are_refused_even_when_named_like_a_pinned_file(
    bundle: Path, trusted: TrustedKeys, tmp_path: Path
) -> None:
    link = tarfile.TarInfo("golden.npz")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {"golden.npz": None}, (link,))
    with pytest.raises(BundleError, match="not a regular file"):
        unpack_bundle(bad, tmp_path / "out", trusted)


def test_a_file_that_is_not_a_bundle_gets_one_clear_error(tmp_path: Path, trusted: TrustedKeys) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(BundleError, match="not a readable bundle"):
        verify_bundle(junk, trusted)


def test_a_signature_file_that_is_not_json_is_refused(bundle: Path, trusted: TrustedKeys, tmp_path: Path) -> None:
    bad = _rewrite(bundle, tmp_path / "bad.bundle", {SIGNATURE_NAME: b"{nope"})
    with pytest.raises(BundleError, match=r"signature\.json is malformed"):
        verify_bundle(bad, trusted)


def test_signing_keys_are_never_overwritten(tmp_path: Path) -> None:
    generate_keypair(tmp_path)
    with pytest.raises(Exception, match="refusing to overwrite"):
        generate_keypair(tmp_path)
    assert oct((tmp_path / "signing.key").stat().st_mode & 0o777) == "0o600"
    assert SigningKey.load(tmp_path / "signing.key").key_id


@pytest.mark.parametrize("p90", ["1e400", "-1.0"])
def test_a_manifest_whose_latency_figure_is_infinite_or_negative_is_refused(bundle: Path, p90: str) -> None:
    """The host widens a device's latency limit by the build's p90 (control/rollout/judge/latency.py): a number that
    parses (1e400 reads as infinity) but is no timing is refused with the manifest, never taken as a limit."""
    data = json.loads(read_signed_manifest(bundle).manifest_json)
    assert data["latency"] is not None
    data["latency"]["p90_ms"] = "P90"
    text = json.dumps(data).replace('"P90"', p90)
    with pytest.raises(BundleError, match="invalid manifest"):
        parse_manifest(text)
    data["latency"]["p90_ms"] = 2 * data["latency"]["median_ms"]
    assert parse_manifest(json.dumps(data)).latency is not None, "a finite figure passes"
