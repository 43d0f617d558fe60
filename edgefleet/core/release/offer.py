"""The release offer: a release's manifest and its transfer layout under ONE release-role signature, and the rules a
device applies before it fetches a byte (the document's exact release, the platform, the version floor).

The signature is over domain-separated bytes (`edgefleet:release-offer:v1`), so no bundle offer, desired document
or key set passes for a release offer, and the other way round; the bundle key cannot sign a release and the release
key cannot sign a bundle (each role's keys are its own in the key set).
"""

from __future__ import annotations

import json

from edgefleet.core.errors import SignatureError
from edgefleet.core.messages import AgentRelease, BundleOffer, ReleaseOffer, SignedPayload, Transfer
from edgefleet.core.release.manifest import ReleaseError, ReleaseManifest, check_platform, version_key
from edgefleet.core.transfer.chunk_index import pages_match
from edgefleet.core.trust.keyset import signing_bytes
from edgefleet.core.trust.signing import SigningKey, TrustedKeys


class ReleaseRefused(ReleaseError):
    """A release this device must not install: the reason is reported, and the agent keeps running as it is."""


def release_offer_bytes(release_id: str, manifest_json: str, transfer: Transfer) -> bytes:
    layout = transfer.model_dump(mode="json")
    if not transfer.chunks or transfer.index:
        del layout["chunks"]  # index pages sign the list (as for bundle offers)
    envelope = {"release_id": release_id, "manifest_json": manifest_json, "transfer": layout}
    return signing_bytes("release-offer", json.dumps(envelope, sort_keys=True, separators=(",", ":")))


def sign_release_offer(
    release_id: str, manifest_json: str, transfer: Transfer, key: SigningKey, keyset: SignedPayload | None
) -> ReleaseOffer:
    return ReleaseOffer(
        release_id=release_id,
        manifest_json=manifest_json,
        key_id=key.key_id,
        signature=key.sign(release_offer_bytes(release_id, manifest_json, transfer)),
        transfer=transfer,
        keyset=keyset,
    )


def verify_release_offer(offer: ReleaseOffer, trusted: TrustedKeys) -> None:
    """SignatureError unless a trusted release key signed this manifest WITH this layout."""
    data = release_offer_bytes(offer.release_id, offer.manifest_json, offer.transfer)
    trusted.verify(data, offer.key_id, offer.signature)
    if not pages_match(offer.transfer):
        raise SignatureError(f"the chunk list of {offer.release_id} is not what its signed index pages hold")


def check_release_ref(manifest: ReleaseManifest, offer: ReleaseOffer, wanted: AgentRelease, floor: str) -> None:
    """ReleaseRefused unless the signed offer is exactly the release the signed document names, built for this
    Python and platform, and above the device's agent floor (or, at or below it, named by the document's
    `allow_downgrade_to`)."""
    if manifest.release_id != offer.release_id or offer.release_id != wanted.release_id:
        raise ReleaseRefused(f"signed release manifest is {manifest.release_id}, not the desired {wanted.release_id}")
    if manifest.version != wanted.version:
        raise ReleaseRefused(f"release {manifest.release_id} is version {manifest.version}, not {wanted.version}")
    try:
        check_platform(manifest)
    except ReleaseError as err:
        raise ReleaseRefused(str(err)) from err
    if version_key(manifest.version) <= version_key(floor) and wanted.allow_downgrade_to != manifest.release_id:
        raise ReleaseRefused(
            f"agent version {manifest.version} is not newer than {floor}, the highest this device committed (a "
            "downgrade must be a signed decision naming this release in allow_downgrade_to)"
        )


def transfer_carrier(offer: ReleaseOffer) -> BundleOffer:
    """The release offer in the shape the transfer layer fetches (agent/transfer: `open_download`, `resolve_index`
    read only the id and the layout). Never verified as a bundle offer: its signature is the release key's."""
    return BundleOffer(
        bundle_id=offer.release_id,
        manifest_json=offer.manifest_json,
        key_id=offer.key_id,
        signature=offer.signature,
        transfer=offer.transfer,
        keyset=offer.keyset,
    )


__all__ = [
    "ReleaseRefused",
    "check_release_ref",
    "release_offer_bytes",
    "sign_release_offer",
    "transfer_carrier",
    "verify_release_offer",
]
