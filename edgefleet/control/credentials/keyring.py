"""The host's keys: root (offline), the bundle and ops role keys, the root-signed key set, the ops counter.

Layout of a key directory (default $EDGEFLEET_HOME/keys):
  root.key / root.pub        root: signs key sets only. Devices pin root.pub. Keep root.key OFFLINE.
  bundle.key / bundle.pub    bundle role: signs bundles and offers (converter / release machine).
  ops.key / ops.pub          ops role: signs desired state (control plane).
  release.key / release.pub  release role: signs agent releases (the agent's own wheel set; `edgefleet release`).
  keyset.json                the root-signed key set (public; travels in every offer and desired document)
  retired/                   role keys rotated out (kept for audit; no longer in the key set)
  ops-counter                the high-water mark of desired-state counters (see `next_counter`)

Every private key file is created 0600 and never overwritten.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefleet.core.errors import SignatureError, UserInputError
from edgefleet.core.home import keys_dir
from edgefleet.core.messages import SignedPayload
from edgefleet.core.trust.keyset import ROLES, KeySet, Role, public_pem, sign_keyset, verify_keyset
from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair

DEFAULT_KEYSET_DAYS = 365.0
KEYSET_NAME = "keyset.json"
COUNTER_NAME = "ops-counter"


@dataclass(frozen=True)
class HostKeys:
    """What host commands sign with; each part is loaded only when used, so a host holds only what it needs."""

    directory: Path

    @classmethod
    def default(cls) -> HostKeys:
        return cls(keys_dir())

    def bundle_key(self) -> SigningKey:
        return _load_key(self.directory / "bundle.key", "bundle")

    def ops_key(self) -> SigningKey:
        return _load_key(self.directory / "ops.key", "ops")

    def release_key(self) -> SigningKey:
        return _load_key(self.directory / "release.key", "release")

    def keyset(self) -> SignedPayload:
        path = self.directory / KEYSET_NAME
        try:
            return SignedPayload.model_validate_json(path.read_bytes())
        except FileNotFoundError as err:
            raise UserInputError(f"no key set at {path}; create one with `edgefleet keys init`") from err
        except ValueError as err:
            raise UserInputError(f"{path} is not a signed key set: {err}") from err

    def root_public(self) -> Path:
        return self.directory / "root.pub"

    def next_counter(self) -> int:
        """A desired-state counter that only grows, across processes and restarts: max(previous + 1, now in ms),
        with the high-water mark persisted (fsync'd, under an flock) before the counter is used."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / COUNTER_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            text = handle.read().strip()
            previous = int(text) if text.isdigit() else 0
            counter = max(previous + 1, int(time.time() * 1000))
            handle.seek(0)
            handle.truncate()
            handle.write(str(counter))
            handle.flush()
            os.fsync(handle.fileno())
        return counter


def _load_key(path: Path, role: str) -> SigningKey:
    if not path.exists():
        raise UserInputError(f"no {role} key at {path}; create the keys with `edgefleet keys init`")
    return SigningKey.load(path)


# --- administration (`edgefleet keys ...`)
def init(directory: Path, *, days: float = DEFAULT_KEYSET_DAYS) -> dict[str, Any]:
    """Root, bundle and ops keys (each created only if missing) and a key set delegating both roles."""
    if not (directory / "root.key").exists():
        generate_keypair(directory, "root")
    for role in ROLES:
        if not (directory / f"{role}.key").exists():
            generate_keypair(directory, role)
    return delegate(directory, days=days)


def delegate(directory: Path, *, days: float = DEFAULT_KEYSET_DAYS, revoke: tuple[str, ...] = ()) -> dict[str, Any]:
    """Sign a new key set (version + 1) naming the current bundle and ops keys; revoked ids stay revoked."""
    root = _load_key(directory / "root.key", "root")
    previous = _current(directory, root)
    roles: dict[Role, dict[str, str]] = {}
    for role in ROLES:
        if (directory / f"{role}.key").exists():
            key = SigningKey.load(directory / f"{role}.key")
            roles[role] = {key.key_id: public_pem(key.private.public_key())}
    revoked = sorted({*(previous.revoked if previous else []), *revoke})
    for role, keys in roles.items():
        active = [kid for kid in keys if kid in revoked]
        if active:
            raise UserInputError(f"the {role} key {active[0]} is revoked; rotate it first (`edgefleet keys rotate`)")
    keyset = KeySet(
        version=(previous.version + 1) if previous else 1,
        expires_at=time.time() + days * 86400,
        roles=roles,
        revoked=revoked,
    )
    signed = sign_keyset(keyset, root)
    tmp = directory / f".{KEYSET_NAME}.tmp"
    tmp.write_text(signed.model_dump_json(indent=2))
    os.replace(tmp, directory / KEYSET_NAME)
    return show(directory)


def rotate(directory: Path, role: Role, *, days: float = DEFAULT_KEYSET_DAYS) -> dict[str, Any]:
    """A new key for `role`; the old one moves to retired/ and leaves the key set (it is not revoked)."""
    _retire(directory, role)
    generate_keypair(directory, role)
    return delegate(directory, days=days)


def revoke(directory: Path, key_id: str, *, days: float = DEFAULT_KEYSET_DAYS) -> dict[str, Any]:
    """Never trust `key_id` again. If it is a current role key, that role is rotated in the same key set."""
    for role in ROLES:
        path = directory / f"{role}.key"
        if path.exists() and SigningKey.load(path).key_id == key_id:
            _retire(directory, role)
            generate_keypair(directory, role)
    return delegate(directory, days=days, revoke=(key_id,))


def show(directory: Path) -> dict[str, Any]:
    root = _load_root_public(directory)
    signed = HostKeys(directory).keyset()
    keyset = verify_keyset(signed, root, now=0.0)  # shown even once expired (`expired` says so)
    return {
        "directory": str(directory),
        "root_key_id": root.ids[0],
        "keyset_version": keyset.version,
        "expires_at": keyset.expires_at,
        "expired": keyset.expires_at <= time.time(),
        "roles": {role: sorted(keys) for role, keys in keyset.roles.items()},
        "revoked": keyset.revoked,
    }


def _retire(directory: Path, role: Role) -> None:
    path = directory / f"{role}.key"
    if not path.exists():
        raise UserInputError(f"no {role} key in {directory} to rotate")
    kid = SigningKey.load(path).key_id
    retired = directory / "retired"
    retired.mkdir(mode=0o700, exist_ok=True)
    shutil.move(str(path), retired / f"{role}-{kid}.key")
    pub = directory / f"{role}.pub"
    if pub.exists():
        shutil.move(str(pub), retired / f"{role}-{kid}.pub")


def _load_root_public(directory: Path) -> TrustedKeys:
    if not (directory / "root.pub").exists():
        raise UserInputError(f"no keys in {directory}: create them with `edgefleet keys init --dir {directory}`")
    return TrustedKeys.load([directory / "root.pub"])


def _current(directory: Path, root: SigningKey) -> KeySet | None:
    path = directory / KEYSET_NAME
    if not path.exists():
        return None
    signed = HostKeys(directory).keyset()
    pinned = TrustedKeys({root.key_id: root.private.public_key()})
    try:
        return verify_keyset(signed, pinned, now=0.0)
    except SignatureError as err:
        raise UserInputError(f"{path} does not verify against {directory / 'root.key'}: {err}") from err
