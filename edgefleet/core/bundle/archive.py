"""The bundle file: a tar holding manifest.json, signature.json and the files the manifest pins.

The signature covers the exact bytes of manifest.json, and the manifest pins the size and sha256 of
every other file, so one signature check plus one hash per file proves the whole bundle. Reading a
bundle never extracts with tarfile's own extract (no links, no devices, no paths outside the target)
and never unpickles anything.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pydantic import ValidationError

from edgefleet.core.bundle.manifest import FileEntry, Manifest
from edgefleet.core.durable import copy_hashed
from edgefleet.core.errors import BundleError, DiskFullError

if TYPE_CHECKING:  # keys arrive as objects: reading a manifest never loads cryptography (the agent's idle RSS)
    from edgefleet.core.trust.signing import SigningKey, TrustedKeys

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "signature.json"
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_CHUNK = 1 << 20
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class SignedManifest:
    """The manifest's exact bytes and the signature over them; this pair also travels over MQTT."""

    manifest_json: str
    key_id: str
    signature: str

    def verify(self, trusted: TrustedKeys) -> Manifest:
        trusted.verify(self.manifest_json.encode("utf-8"), self.key_id, self.signature)
        return parse_manifest(self.manifest_json)

    def signature_json(self) -> str:
        return json.dumps({"algorithm": "ed25519", "key_id": self.key_id, "signature": self.signature})

    @classmethod
    def from_texts(cls, manifest_json: str, signature_text: str) -> SignedManifest:
        try:
            sig = json.loads(signature_text)
            return cls(manifest_json, str(sig["key_id"]), str(sig["signature"]))
        except (ValueError, KeyError, TypeError) as err:
            raise BundleError("signature.json is malformed") from err

    @classmethod
    def from_dir(cls, directory: Path) -> SignedManifest:
        """The signed manifest an installed bundle keeps beside its files."""
        return cls.from_texts(
            (directory / MANIFEST_NAME).read_text("utf-8"), (directory / SIGNATURE_NAME).read_text("utf-8")
        )


def parse_manifest(text: str) -> Manifest:
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as err:
        raise BundleError(f"invalid manifest: {err.errors()[0]['msg']} at {err.errors()[0]['loc']}") from err


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(sources: dict[str, Path]) -> list[FileEntry]:
    """File entries (path, size, sha256) for the files a bundle will carry."""
    return [
        FileEntry(path=_safe_relpath(rel), size=src.stat().st_size, sha256=sha256_file(src))
        for rel, src in sorted(sources.items())
    ]


def sign_manifest(manifest: Manifest, key: SigningKey) -> SignedManifest:
    text = manifest.model_dump_json(indent=2)
    return SignedManifest(text, key.key_id, key.sign(text.encode("utf-8")))


def pack_bundle(out_path: Path, manifest: Manifest, sources: dict[str, Path], key: SigningKey) -> SignedManifest:
    """Write a signed bundle atomically (temp file + rename), so a crash never leaves half a bundle."""
    pinned = {entry.path for entry in manifest.files}
    if pinned != set(sources):
        raise BundleError(f"manifest pins {sorted(pinned)} but sources are {sorted(sources)}")
    signed = sign_manifest(manifest, key)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, MANIFEST_NAME, signed.manifest_json.encode("utf-8"))
        _add_bytes(tar, SIGNATURE_NAME, signed.signature_json().encode("utf-8"))
        for rel in sorted(sources):
            info = tar.gettarinfo(str(sources[rel]), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            info.mtime = int(manifest.created_at.timestamp())
            with sources[rel].open("rb") as handle:
                tar.addfile(info, handle)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, out_path)
    return signed


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _safe_relpath(rel: str) -> str:
    """Bundle paths are relative, '/'-separated, without '..': nothing can land outside the bundle."""
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or "\\" in rel or str(path) != rel:
        raise BundleError(f"unsafe path in bundle: {rel!r}")
    return rel


def _open(bundle_path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(bundle_path, "r:")
    except FileNotFoundError as err:
        raise BundleError(f"bundle {bundle_path} not found") from err
    except (tarfile.TarError, OSError) as err:
        raise BundleError(f"{bundle_path} is not a readable bundle: {err}") from err


def _read_small(tar: tarfile.TarFile, name: str) -> str:
    try:
        member = tar.getmember(name)
    except KeyError as err:
        raise BundleError(f"bundle has no {name}") from err
    if not member.isfile() or member.size > _MAX_MANIFEST_BYTES:
        raise BundleError(f"{name} in bundle is not a regular file of sane size")
    handle = tar.extractfile(member)
    assert handle is not None  # isfile() checked above
    try:
        return handle.read().decode("utf-8")
    except UnicodeDecodeError as err:
        raise BundleError(f"{name} is not UTF-8") from err


def read_signed_manifest(bundle_path: Path) -> SignedManifest:
    """The manifest and its signature, unverified (for `bundle show` and for publishing)."""
    try:
        with _open(bundle_path) as tar:
            manifest_json = _read_small(tar, MANIFEST_NAME)
            signature_text = _read_small(tar, SIGNATURE_NAME)
    except (tarfile.TarError, OSError) as err:
        raise BundleError(f"{bundle_path.name} is truncated or corrupt: {err}") from err
    return SignedManifest.from_texts(manifest_json, signature_text)


def verify_bundle(bundle_path: Path, trusted: TrustedKeys) -> Manifest:
    """Check the signature and every pinned file's size and hash without writing anything."""
    return _walk(bundle_path, trusted, dest=None)


def unpack_bundle(bundle_path: Path, dest: Path, trusted: TrustedKeys) -> Manifest:
    """Verify and extract into `dest` (which must not exist yet). On any failure `dest` is removed."""
    if dest.exists():
        raise BundleError(f"unpack target {dest} already exists")
    dest.mkdir(parents=True)
    try:
        return _walk(bundle_path, trusted, dest)
    except BaseException:
        _remove_tree(dest)
        raise


def unpack_pinned(bundle_path: Path, dest: Path, manifest_json: str) -> Manifest:
    """Extract a bundle file assembled from pieces each checked against a signed offer carrying `manifest_json`
    (agent/transfer/blocks.py: no whole-file hash; this is the check of the assembled file): its manifest.json must
    be those exact bytes and every file must match its pin. Directories are fsync'd. A full disk raises
    DiskFullError (transient); `dest` is removed on any failure."""
    manifest = parse_manifest(manifest_json)
    if dest.exists():
        raise BundleError(f"unpack target {dest} already exists")
    try:
        dest.mkdir(parents=True)
        try:
            with _open(bundle_path) as tar:
                inner = _read_small(tar, MANIFEST_NAME)
        except (tarfile.TarError, OSError) as err:
            raise BundleError(f"{bundle_path.name} is truncated or corrupt: {err}") from err
        if inner != manifest_json:
            raise BundleError("the bundle's manifest differs from the signed offer's")
        _extract(bundle_path, manifest, dest)
        fsync_tree(dest)
    except BaseException:
        _remove_tree(dest)
        raise
    return manifest


def fsync_tree(root: Path) -> None:
    """fsync every directory under `root` (and root): new entries survive a power cut."""
    dirs = [root, *(p for p in root.rglob("*") if p.is_dir())]
    for directory in reversed(dirs):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def verify_files(directory: Path, manifest: Manifest) -> None:
    """Check an unpacked bundle's files against the manifest (an installed bundle, at start-up)."""
    for entry in manifest.files:
        path = directory.joinpath(*PurePosixPath(_safe_relpath(entry.path)).parts)
        if not path.is_file() or path.stat().st_size != entry.size or sha256_file(path) != entry.sha256:
            raise BundleError(f"installed file {entry.path} is missing or modified")


def _walk(bundle_path: Path, trusted: TrustedKeys, dest: Path | None) -> Manifest:
    manifest = read_signed_manifest(bundle_path).verify(trusted)
    _extract(bundle_path, manifest, dest)
    if dest is not None:
        fsync_tree(dest)
    return manifest


def _extract(bundle_path: Path, manifest: Manifest, dest: Path | None) -> None:
    expected = {entry.path: entry for entry in manifest.files}
    for rel in expected:
        _safe_relpath(rel)
    seen: set[str] = set()
    try:
        _check_members(bundle_path, expected, seen, dest)
    except OSError as err:
        if err.errno in _DISK_FULL:
            raise DiskFullError(f"disk full while unpacking {bundle_path.name}: {err}") from err
        raise BundleError(f"{bundle_path.name} is truncated or corrupt: {err}") from err
    except tarfile.TarError as err:
        raise BundleError(f"{bundle_path.name} is truncated or corrupt: {err}") from err
    missing = sorted(set(expected) - seen)
    if missing:
        raise BundleError(f"bundle is missing pinned files: {', '.join(missing)}")


def _check_members(bundle_path: Path, expected: dict[str, FileEntry], seen: set[str], dest: Path | None) -> None:
    with _open(bundle_path) as tar:
        for member in tar:
            if member.name in (MANIFEST_NAME, SIGNATURE_NAME):
                continue
            entry = expected.get(member.name)
            if entry is None:
                raise BundleError(f"bundle holds {member.name!r}, which the manifest does not pin")
            if not member.isfile():
                raise BundleError(f"bundle entry {member.name!r} is not a regular file")
            if member.name in seen:
                raise BundleError(f"bundle entry {member.name!r} appears twice")
            seen.add(member.name)
            _check_member(tar, member, entry, dest)


def _check_member(tar: tarfile.TarFile, member: tarfile.TarInfo, entry: FileEntry, dest: Path | None) -> None:
    if member.size != entry.size:
        raise BundleError(f"{entry.path}: size {member.size} differs from the manifest's {entry.size}")
    source = tar.extractfile(member)
    assert source is not None  # isfile() checked by the caller
    out = None
    if dest is not None:
        target = dest.joinpath(*PurePosixPath(entry.path).parts)
        if not target.resolve().is_relative_to(dest.resolve()):
            raise BundleError(f"bundle entry {entry.path!r} escapes the install directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        out = target.open("xb")
    try:
        found = copy_hashed(source, out, _CHUNK)
    finally:
        if out is not None:
            out.close()
    if found != entry.sha256:
        raise BundleError(f"{entry.path}: sha256 does not match the manifest (tampered or corrupt)")


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
