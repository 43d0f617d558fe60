"""The release file: a tar of `release.json`, `release.sig` and `wheels/*.whl`, written deterministically.

Members carry no time or owner, in a fixed order, so the same wheel lands in the same bytes in every release that
holds it: its chunks (core/transfer/chunks.py) are the same, and a device that installed one release fetches only
the wheels the next one changed. Unpacking takes exactly the pinned members, checks every size and sha256 as it
writes, and never writes outside its directory.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgefleet.core.durable import copy_hashed, fsync_dir
from edgefleet.core.release.manifest import (
    ReleaseError,
    ReleaseFile,
    ReleaseManifest,
    parse_release_manifest,
    release_id_for,
    this_platform,
    this_python,
)
from edgefleet.core.trust.keyset import signing_bytes
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

MANIFEST_NAME = "release.json"
SIGNATURE_NAME = "release.sig"
WHEELS_DIR = "wheels"
MAX_SMALL = 1 << 20  # the manifest and the signature are read into memory: at most this


@dataclass(frozen=True)
class SignedRelease:
    manifest_json: str
    key_id: str
    signature: str

    def verify(self, trusted: TrustedKeys) -> ReleaseManifest:
        """The manifest, once a trusted release key's signature over its exact bytes verifies."""
        trusted.verify(signing_bytes("release", self.manifest_json), self.key_id, self.signature)
        return parse_release_manifest(self.manifest_json)


def build_release(
    wheels: Path,
    version: str,
    key: SigningKey,
    out: Path,
    *,
    requirement: str = "edgefleet[cpu]",
    python: str | None = None,
    platform_tag: str | None = None,
) -> ReleaseManifest:
    """Pin and sign every wheel in `wheels` (the edgefleet wheel of `version` and its dependencies) into `out`."""
    files = sorted(p for p in wheels.glob("*.whl") if p.is_file())
    if not files:
        raise ReleaseError(f"no wheels in {wheels}")
    python, platform_tag = python or this_python(), platform_tag or this_platform()
    manifest = ReleaseManifest(
        release_id=release_id_for(version, python, platform_tag),
        version=version,
        requirement=requirement,
        python=python,
        platform=platform_tag,
        files=[ReleaseFile(name=p.name, size=p.stat().st_size, sha256=_sha256(p)) for p in files],
        created_at=round(time.time(), 3),
    )
    manifest_json = manifest.model_dump_json()
    parse_release_manifest(manifest_json)  # the checks a device makes (an edgefleet wheel of this version)
    signature = json.dumps({"key_id": key.key_id, "signature": key.sign(signing_bytes("release", manifest_json))})
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, MANIFEST_NAME, manifest_json.encode())
        _add_bytes(tar, SIGNATURE_NAME, signature.encode())
        for path in files:
            info = _info(f"{WHEELS_DIR}/{path.name}", path.stat().st_size)
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    os.replace(tmp, out)
    return manifest


def read_release(path: Path) -> SignedRelease:
    """The manifest text and its signature, unverified (ReleaseError for a file that is not a release)."""
    try:
        with tarfile.open(path, "r:") as tar:
            manifest_json = _read_small(tar, MANIFEST_NAME).decode("utf-8")
            sig = json.loads(_read_small(tar, SIGNATURE_NAME))
    except (tarfile.TarError, OSError, UnicodeDecodeError, ValueError) as err:
        raise ReleaseError(f"{path.name} is not a readable agent release: {err}") from err
    if not isinstance(sig, dict) or not isinstance(sig.get("key_id"), str) or not isinstance(sig.get("signature"), str):
        raise ReleaseError(f"{path.name}: {SIGNATURE_NAME} is malformed")
    return SignedRelease(manifest_json, sig["key_id"], sig["signature"])


def verify_release_file(path: Path, trusted: TrustedKeys) -> ReleaseManifest:
    """Signature by a trusted release key, then every wheel's size and sha256 (SignatureError / ReleaseError)."""
    manifest = read_release(path).verify(trusted)
    _walk(path, manifest, None)
    return manifest


def unpack_release(path: Path, dest: Path, manifest_json: str) -> ReleaseManifest:
    """Extract a release assembled from pieces checked against a signed offer carrying `manifest_json`: its
    release.json must be those exact bytes, and exactly the pinned wheels, each matching its size and sha256, are
    written under `dest/wheels`. `dest` must not exist; it is removed on any failure; directories are fsync'd."""
    manifest = parse_release_manifest(manifest_json)
    if dest.exists():
        raise ReleaseError(f"unpack target {dest} already exists")
    try:
        (dest / WHEELS_DIR).mkdir(parents=True)
        if read_release(path).manifest_json != manifest_json:
            raise ReleaseError("the release file's manifest differs from the signed offer's")
        _walk(path, manifest, dest / WHEELS_DIR)
        (dest / MANIFEST_NAME).write_text(manifest_json)
        fsync_dir(dest / WHEELS_DIR)
        fsync_dir(dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return manifest


def _walk(path: Path, manifest: ReleaseManifest, dest: Path | None) -> None:
    """Every member is a pinned wheel (or the manifest and signature), each exactly once, matching its pin."""
    pinned = {f"{WHEELS_DIR}/{f.name}": f for f in manifest.files}
    seen: set[str] = set()
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if member.name in (MANIFEST_NAME, SIGNATURE_NAME) and member.isfile():
                    continue
                entry = pinned.get(member.name)
                if entry is None or not member.isfile() or member.name in seen:
                    raise ReleaseError(f"release holds an unexpected member {member.name!r}")
                if member.size != entry.size:
                    raise ReleaseError(f"{entry.name} is {member.size} bytes; the manifest pins {entry.size}")
                seen.add(member.name)
                _copy_checked(tar, member, entry, dest)
    except (tarfile.TarError, OSError) as err:
        raise ReleaseError(f"{path.name} is truncated or corrupt: {err}") from err
    missing = sorted(set(pinned) - seen)
    if missing:
        raise ReleaseError(f"release lacks pinned wheels: {', '.join(missing[:5])}")


def _copy_checked(tar: tarfile.TarFile, member: tarfile.TarInfo, entry: ReleaseFile, dest: Path | None) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise ReleaseError(f"{entry.name} cannot be read")
    target = dest / entry.name if dest is not None else None
    out = target.open("wb") if target is not None else None
    try:
        found = copy_hashed(source, out)
    finally:
        if out is not None:
            out.close()
    if found != entry.sha256:
        if target is not None:
            target.unlink(missing_ok=True)
        raise ReleaseError(f"{entry.name} does not match its sha256 pin")


def _read_small(tar: tarfile.TarFile, name: str) -> bytes:
    try:
        member = tar.getmember(name)
    except KeyError as err:
        raise ReleaseError(f"release lacks {name}") from err
    if not member.isfile() or member.size > MAX_SMALL:
        raise ReleaseError(f"{name} is not a small regular file")
    handle = tar.extractfile(member)
    assert handle is not None
    return handle.read()


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0o644, 0, 0, 0, "", ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_info(name, len(data)), io.BytesIO(data))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while piece := handle.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "WHEELS_DIR",
    "SignedRelease",
    "build_release",
    "read_release",
    "unpack_release",
    "verify_release_file",
]
