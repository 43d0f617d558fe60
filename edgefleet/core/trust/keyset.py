"""Key roles (TUF-like): a ROOT key that devices pin delegates a BUNDLE role (the converter/publisher signs
offers), an OPS role (operations sign desired state) and a RELEASE role (signs agent releases: the wheel set a
device's agent updates itself to, core/release/) in a versioned, expiring key-set document.

Every signature is over domain-separated bytes (`edgefleet:<kind>:v1\\n` + the document), so a signed key set can
never be replayed as a desired document or an offer, and the other way round. Rotating or revoking a role key is a
new key-set version signed by root; devices keep the highest version they have seen and never go back.
"""

from __future__ import annotations

import time
from typing import Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefleet.core.errors import SignatureError
from edgefleet.core.messages import SignedPayload
from edgefleet.core.trust.signing import SigningKey, TrustedKeys, key_id

Role = Literal["bundle", "ops", "release"]
ROLES: tuple[Role, ...] = ("bundle", "ops", "release")
DocumentKind = Literal["keyset", "desired", "offer", "release", "release-offer"]


def signing_bytes(kind: DocumentKind, payload: str) -> bytes:
    """What a signature of `kind` covers: a domain tag, then the document's exact text."""
    return f"edgefleet:{kind}:v1\n".encode() + payload.encode("utf-8")


class KeySet(BaseModel):
    """Root-signed delegation: which public keys may act in which role, until when."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = Field(ge=1, description="devices keep the highest version they have seen")
    expires_at: float = Field(description="a device refuses to adopt a key set past this time")
    roles: dict[Role, dict[str, str]] = Field(description="role -> key id -> PEM public key")
    revoked: list[str] = Field(default_factory=list, description="key ids never trusted again, in any role")

    def trusted(self, role: Role) -> TrustedKeys:
        keys: dict[str, Ed25519PublicKey] = {}
        for kid, pem in self.roles.get(role, {}).items():
            if kid not in self.revoked:
                keys[kid] = public_from_pem(pem)
        return TrustedKeys(keys)


def public_from_pem(pem: str) -> Ed25519PublicKey:
    try:
        public = serialization.load_pem_public_key(pem.encode("ascii"))
    except ValueError as err:
        raise SignatureError(f"key set holds a public key that is not PEM: {err}") from err
    if not isinstance(public, Ed25519PublicKey):
        raise SignatureError("key set holds a key that is not ed25519")
    return public


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def sign_payload(kind: Literal["keyset", "desired"], payload: str, key: SigningKey) -> SignedPayload:
    return SignedPayload(
        kind=kind, payload=payload, key_id=key.key_id, signature=key.sign(signing_bytes(kind, payload))
    )


def verify_payload(kind: Literal["keyset", "desired"], signed: SignedPayload, trusted: TrustedKeys) -> str:
    """The payload text, once its signature verifies against `trusted` (SignatureError otherwise)."""
    if signed.kind != kind:
        raise SignatureError(f"a signed {signed.kind} document where a {kind} document belongs")
    trusted.verify(signing_bytes(kind, signed.payload), signed.key_id, signed.signature)
    return signed.payload


def sign_keyset(keyset: KeySet, root: SigningKey) -> SignedPayload:
    return sign_payload("keyset", keyset.model_dump_json(), root)


def verify_keyset(signed: SignedPayload, root: TrustedKeys, *, now: float | None = None) -> KeySet:
    """A key set signed by a pinned root key and not expired; SignatureError otherwise."""
    text = verify_payload("keyset", signed, root)
    try:
        keyset = KeySet.model_validate_json(text)
    except ValidationError as err:
        raise SignatureError(f"root-signed key set is malformed: {err.errors()[0]['msg']}") from err
    for role, keys in keyset.roles.items():
        for kid, pem in keys.items():
            if key_id(public_from_pem(pem)) != kid:
                raise SignatureError(f"key set lists {role} key {kid} under a key id that is not its own")
    if keyset.expires_at <= (time.time() if now is None else now):
        raise SignatureError(f"key set version {keyset.version} expired at {keyset.expires_at:.0f}")
    return keyset
