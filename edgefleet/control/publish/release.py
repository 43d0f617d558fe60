"""Publishing an agent release: its wheels as retained content-addressed chunks (shared with every bundle and release
on the broker, so a chunk is published once), then the retained offer on `agent-releases/{id}/offer`, signed by the
release-role key over the manifest and the layout (so publishing needs the release key: run it where that key
lives). The file's own signature is checked against the key set first: a release the devices would refuse never
goes out.
"""

from __future__ import annotations

import logging
from pathlib import Path

from edgefleet.control.broker.retained import read_retained
from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.publish.chunks import publish_chunks, referenced_chunks, retained_offers
from edgefleet.core.errors import BrokerError, SignatureError
from edgefleet.core.messages import ChunkRef, MessageError, ReleaseOffer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.release import ReleaseManifest, read_release, sign_release_offer, verify_release_file
from edgefleet.core.release.manifest import ReleaseError
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE
from edgefleet.core.trust.keyset import verify_keyset
from edgefleet.core.trust.signing import TrustedKeys

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0


def verify_with_keyset(path: Path, keys: HostKeys) -> ReleaseManifest:
    """The release file checked as a device would: a release key the root-signed key set delegates, every pin."""
    root = TrustedKeys.load([keys.root_public()])
    keyset = verify_keyset(keys.keyset(), root, now=0.0)
    trusted = keyset.trusted("release")
    if not trusted.ids:
        raise SignatureError("the key set delegates no release key: run `edgefleet keys init` to add one")
    return verify_release_file(path, trusted)


def retained_release_chunks(conn: Connection, topics: Topics) -> dict[str, ChunkRef]:
    """Every chunk a retained release offer lists inline (for dedupe; paged lists are published again)."""
    payloads, complete = read_retained(conn, topics.prefix, [topics.agent_release_offers()], READ_TIMEOUT_S)
    if not complete:
        raise BrokerError(f"could not read the retained release offers within {READ_TIMEOUT_S:g} s")
    known: dict[str, ChunkRef] = {}
    for topic, payload in payloads.items():
        try:
            offer = decode(ReleaseOffer, payload)
        except MessageError as err:
            log.debug("ignoring a malformed retained release offer on %s: %s", topic, err)
            continue
        known.update({ref.sha256: ref for ref in [*offer.transfer.chunks, *offer.transfer.index]})
    return known


def publish_release(
    conn: Connection, topics: Topics, path: Path, *, keys: HostKeys | None = None, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[ReleaseManifest, ReleaseOffer, int]:
    """Publish the release's chunks (those not on the broker yet), then its signed offer; the chunks published."""
    keys = keys or HostKeys.default()
    key, keyset = keys.release_key(), keys.keyset()  # fail before publishing a chunk
    manifest = verify_with_keyset(path, keys)
    signed = read_release(path)
    if signed.key_id != key.key_id:
        log.info("release %s was signed by %s; its offer is signed by %s", manifest.release_id, signed.key_id,
                 key.key_id)  # fmt: skip
    known = {**referenced_chunks(retained_offers(conn, topics)), **retained_release_chunks(conn, topics)}
    done = publish_chunks(conn, topics, path, max_size=block_size, known=known)
    if done.sha256 == "":
        raise ReleaseError(f"{path} is empty")
    transfer = done.transfer(path.stat().st_size, block_size)
    offer = sign_release_offer(manifest.release_id, signed.manifest_json, transfer, key, keyset)
    conn.publish(topics.agent_release_offer(manifest.release_id), offer.encode(), qos=1, retain=True,
                 wait=ACK_TIMEOUT_S)  # fmt: skip
    log.info("published agent release %s: %d bytes, %d chunks published, %d already on the broker",
             manifest.release_id, transfer.size, done.published, done.skipped)  # fmt: skip
    return manifest, offer, done.published


__all__ = ["publish_release", "retained_release_chunks", "verify_with_keyset"]
