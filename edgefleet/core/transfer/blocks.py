"""The block layout of a bundle file on MQTT, and the ONE signature that covers it with the manifest.

A bundle offer is the manifest plus the transfer layout (size, block size, every block hash, the whole-file hash).
Both go under one ed25519 signature by a bundle-role key (`offer_signing_bytes`), so a device knows, before it
downloads a byte, exactly how many bytes it will take, and checks each block against a signed hash before it
writes it. `check_layout` refuses layouts that cannot be right (block count that does not match the size).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from edgefleet.core.errors import BundleError, SignatureError
from edgefleet.core.messages import BundleOffer, SignedPayload, Transfer
from edgefleet.core.transfer.chunk_index import index_problem, pages_match
from edgefleet.core.transfer.chunks import layout_problem
from edgefleet.core.trust.keyset import signing_bytes
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

DEFAULT_BLOCK_SIZE = 128 * 1024  # AWS IoT Core caps payloads at 128 KB; EMQX defaults to 1 MB
MAX_BLOCK_SIZE = 16 * 2**20  # one block is held in memory: a device never accepts bigger


class LayoutError(BundleError):
    """A transfer layout that cannot describe any file of its size (refused once, never retried)."""


def describe_transfer(path: Path, block_size: int = DEFAULT_BLOCK_SIZE) -> Transfer:
    whole = hashlib.sha256()
    blocks: list[str] = []
    for block in iter_blocks(path, block_size):
        whole.update(block)
        blocks.append(hashlib.sha256(block).hexdigest())
    return Transfer(size=path.stat().st_size, sha256=whole.hexdigest(), block_size=block_size, block_sha256=blocks)


def iter_blocks(path: Path, block_size: int) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while block := handle.read(block_size):
            yield block


def check_layout(transfer: Transfer, size_limit: int) -> None:
    """Size within the profile's limit; blocks: count equals ceil(size / block_size), hashes well-formed;
    chunks: sizes add up to the file, none above block_size (core/transfer/chunks.py)."""
    if transfer.size > size_limit:
        raise LayoutError(f"offer declares {transfer.size} bytes; this device's profile allows {size_limit}")
    if transfer.block_size > MAX_BLOCK_SIZE:
        raise LayoutError(f"block size {transfer.block_size} exceeds the {MAX_BLOCK_SIZE} bytes a device accepts")
    if transfer.index or transfer.chunk_count:  # index pages (core/transfer/chunk_index.py): counts before any page
        problem = index_problem(transfer)
        if problem:
            raise LayoutError(f"impossible chunk index: {problem}")
        if not transfer.chunks:
            return
        if len(transfer.chunks) != transfer.chunk_count:
            raise LayoutError(f"{len(transfer.chunks)} chunks listed; the offer declares {transfer.chunk_count}")
    if transfer.chunks:
        problem = layout_problem(transfer)
        if problem:
            raise LayoutError(f"impossible chunk layout: {problem}")
        return
    expected = -(-transfer.size // transfer.block_size)
    if transfer.block_count != expected:
        raise LayoutError(
            f"impossible layout: {transfer.block_count} blocks for {transfer.size} bytes "
            f"in blocks of {transfer.block_size} (must be {expected})"
        )
    bad = [i for i, h in enumerate(transfer.block_sha256) if len(h) != 64 or h.strip("0123456789abcdef")]
    if bad:
        raise LayoutError(f"block hashes {bad[:5]} are not sha256 hex digests")


def offer_signing_bytes(bundle_id: str, manifest_json: str, transfer: Transfer) -> bytes:
    """Canonical bytes of the envelope {bundle_id, manifest_json, transfer}: what the bundle key signs."""
    layout = transfer.model_dump(mode="json")
    if not transfer.chunks or transfer.index:
        del layout["chunks"]  # a block offer signs the same bytes it did before chunks existed; pages sign the list
    envelope = {"bundle_id": bundle_id, "manifest_json": manifest_json, "transfer": layout}
    return signing_bytes("offer", json.dumps(envelope, sort_keys=True, separators=(",", ":")))


def sign_offer(
    bundle_id: str, manifest_json: str, transfer: Transfer, key: SigningKey, keyset: SignedPayload | None
) -> BundleOffer:
    signature = key.sign(offer_signing_bytes(bundle_id, manifest_json, transfer))
    return BundleOffer(
        bundle_id=bundle_id,
        manifest_json=manifest_json,
        key_id=key.key_id,
        signature=signature,
        transfer=transfer,
        keyset=keyset,
    )


def verify_offer(offer: BundleOffer, trusted: TrustedKeys) -> None:
    """SignatureError unless a trusted bundle key signed this manifest WITH this transfer layout (a chunk list
    read from index pages must be exactly what the signed pages hold)."""
    trusted.verify(offer_signing_bytes(offer.bundle_id, offer.manifest_json, offer.transfer), offer.key_id,
                   offer.signature)  # fmt: skip
    if not pages_match(offer.transfer):
        raise SignatureError(f"the chunk list of {offer.bundle_id} is not what its signed index pages hold")
