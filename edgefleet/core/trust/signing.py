"""ed25519 signing keys and the set of keys a device trusts."""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgefleet.core.errors import SignatureError, UserInputError


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey

    @property
    def key_id(self) -> str:
        return key_id(self.private.public_key())

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.private.sign(data)).decode("ascii")

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except FileNotFoundError as err:
            raise UserInputError(
                f"signing key {path} not found: create the keys with `edgefleet keys init` (or a whole deployment "
                "with `edgefleet init DIR`), or name the key file with --key"
            ) from err
        except ValueError as err:
            raise UserInputError(f"{path} is not a PEM private key: {err}") from err
        if not isinstance(key, Ed25519PrivateKey):
            raise UserInputError(f"{path} is not an ed25519 private key")
        return cls(key)


def generate_keypair(directory: Path, name: str = "signing") -> tuple[Path, Path]:
    """Write NAME.key (private, mode 0600) and NAME.pub; refuse to overwrite an existing key."""
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / f"{name}.key", directory / f"{name}.pub"
    if private_path.exists():
        raise UserInputError(f"{private_path} already exists; refusing to overwrite a signing key")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path


class TrustedKeys:
    """The public keys a device accepts bundles from, by key id."""

    def __init__(self, keys: dict[str, Ed25519PublicKey]) -> None:
        self._keys = dict(keys)

    @classmethod
    def load(cls, paths: list[Path]) -> TrustedKeys:
        """Each path is a PEM public key file or a directory of `*.pub` files."""
        keys: dict[str, Ed25519PublicKey] = {}
        for path in paths:
            files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
            for file in files:
                try:
                    public = serialization.load_pem_public_key(file.read_bytes())
                except FileNotFoundError as err:
                    raise UserInputError(
                        f"no trusted key at {file}: create the keys with `edgefleet keys init`, or name a public key "
                        "(root.pub) or a folder of them with --trust"
                    ) from err
                except (OSError, ValueError) as err:
                    raise UserInputError(f"cannot read trusted key {file}: {err}") from err
                if not isinstance(public, Ed25519PublicKey):
                    raise UserInputError(f"trusted key {file} is not an ed25519 public key")
                keys[key_id(public)] = public
        if not keys:
            raise UserInputError(f"no trusted public keys found in {', '.join(map(str, paths)) or '(nothing)'}")
        return cls(keys)

    @property
    def ids(self) -> list[str]:
        return sorted(self._keys)

    def public_keys(self) -> dict[str, Ed25519PublicKey]:
        return dict(self._keys)

    def verify(self, data: bytes, signer_key_id: str, signature_b64: str) -> None:
        public = self._keys.get(signer_key_id)
        if public is None:
            raise SignatureError(f"signed by untrusted key {signer_key_id}; trusted: {', '.join(self.ids)}")
        try:
            public.verify(base64.b64decode(signature_b64, validate=True), data)
        except (InvalidSignature, ValueError) as err:
            raise SignatureError(f"signature by key {signer_key_id} does not verify") from err
