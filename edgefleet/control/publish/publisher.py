"""Publishing a bundle: retained chunks (or blocks) first, then the retained offer: the manifest and the layout
under one signature by the bundle-role key (so publishing needs the bundle key: run it where that key lives).

Chunks and blocks are retained, so a device that comes online days later still finds every one, and a device
that resumes subscribes only to those it lacks. The offer goes last: a device that sees it can count on every
piece being there. Chunks are content-addressed and shared across bundles: control/publish/chunks.py publishes
only those no retained offer lists yet.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import paho.mqtt.client as paho

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import DEFAULT_TTL_S, publish_desired
from edgefleet.control.publish.chunks import publish_chunks, referenced_chunks, retained_offers
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BrokerError, BundleError
from edgefleet.core.messages import AgentRelease, BundleOffer, Desired, Transfer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE, iter_blocks, sign_offer

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 60.0
WINDOW = 64  # unacknowledged blocks in flight: bounds host memory


def publish_bundle(
    conn: Connection,
    topics: Topics,
    bundle: Path,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    progress: Callable[[int, int], None] = lambda done, total: None,
    keys: HostKeys | None = None,
    layout: Literal["chunks", "blocks"] = "chunks",
    republish: bool = False,
) -> tuple[Manifest, BundleOffer]:
    """Publish the file's pieces (retained), then the signed offer. `chunks` (the default): content-defined chunks
    shared across bundles, each published once (`republish` sends them all again, e.g. to repair a damaged
    retained chunk); `blocks`: the first layout, fixed-size blocks per bundle."""
    keys = keys or HostKeys.default()
    key, keyset = keys.bundle_key(), keys.keyset()  # fail before publishing a block
    signed = read_signed_manifest(bundle)
    # Parsing (not verifying: the host may not hold the device keys) catches a malformed manifest early.
    manifest = parse_manifest(signed.manifest_json)
    if layout == "chunks":
        transfer = _publish_chunked(conn, topics, bundle, block_size, progress, republish)
    else:
        transfer = _publish_blocks(conn, topics, bundle, manifest.bundle_id, block_size, progress)
    offer = sign_offer(manifest.bundle_id, signed.manifest_json, transfer, key, keyset)
    conn.publish(topics.bundle_offer(manifest.bundle_id), offer.encode(), qos=1, retain=True, wait=ACK_TIMEOUT_S)
    log.info("published %s: %d bytes in %d %s", manifest.bundle_id, transfer.size,
             len(transfer.chunks) or transfer.block_count, layout)  # fmt: skip
    return manifest, offer


def _publish_chunked(
    conn: Connection, topics: Topics, bundle: Path, max_size: int, progress: Callable[[int, int], None],
    republish: bool,
) -> Transfer:  # fmt: skip
    """Content-addressed chunks (control/publish/chunks.py): only those no retained offer lists go out."""
    known = {} if republish else referenced_chunks(retained_offers(conn, topics))
    done = publish_chunks(conn, topics, bundle, max_size=max_size, known=known, progress=progress)
    log.info("%s: %d chunks published (%d bytes), %d already on the broker", bundle.name, done.published,
             done.published_bytes, done.skipped)  # fmt: skip
    return done.transfer(bundle.stat().st_size, max_size)  # chunks inline, or index pages for a long list


def _publish_blocks(
    conn: Connection, topics: Topics, bundle: Path, bundle_id: str, block_size: int,
    progress: Callable[[int, int], None],
) -> Transfer:  # fmt: skip
    """The first layout: fixed-size retained blocks under the bundle's own topics."""
    total = max(1, -(-bundle.stat().st_size // block_size))
    whole = hashlib.sha256()
    block_hashes: list[str] = []
    in_flight: deque[paho.MQTTMessageInfo] = deque()
    # One pass over the file: hash and publish each block, with at most WINDOW unacknowledged (a sliding
    # window bounds host memory without stalling the pipe the way waiting for whole batches would).
    for index, block in enumerate(iter_blocks(bundle, block_size)):
        whole.update(block)
        block_hashes.append(hashlib.sha256(block).hexdigest())
        in_flight.append(conn.publish(topics.bundle_block(bundle_id, index), block, qos=1, retain=True))
        while len(in_flight) >= WINDOW:
            _wait(in_flight.popleft())
        progress(index + 1, total)
    while in_flight:
        _wait(in_flight.popleft())
    if not block_hashes:
        raise BundleError(f"{bundle} is empty")
    return Transfer(
        size=bundle.stat().st_size, sha256=whole.hexdigest(), block_size=block_size, block_sha256=block_hashes
    )


def _wait(info: paho.MQTTMessageInfo) -> None:
    info.wait_for_publish(ACK_TIMEOUT_S)
    if not info.is_published():
        raise BrokerError(f"the broker did not acknowledge a block within {ACK_TIMEOUT_S:g} s")


def deploy(
    conn: Connection,
    topics: Topics,
    manifest: Manifest,
    *,
    devices: list[str],
    groups: list[str],
    rollback: bool = False,
    keys: HostKeys | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    max_bytes_per_s: int | None = None,
    slot: str = DEFAULT_SLOT,
    agent_release: AgentRelease | None = None,
) -> Desired:
    """Set the desired bundle of one slot (retained, signed by the ops key) for each device and group; their other
    slots' documents are not touched. `rollback` makes the signed document allow exactly this bundle below the
    devices' version floor. `agent_release`: the agent release the devices should run (agent/release/)."""
    keys = keys or HostKeys.default()
    desired = Desired(
        slot=slot,
        bundle_id=manifest.bundle_id,
        model_name=manifest.model_name,
        model_version=manifest.model_version,
        profile=manifest.profile,
        rollback=rollback,
        max_bytes_per_s=max_bytes_per_s,
        agent_release=agent_release,
    )
    for device in devices:
        publish_desired(conn, topics, keys, desired, device=device, ttl_s=ttl_s, wait=ACK_TIMEOUT_S)
    for group in groups:
        publish_desired(conn, topics, keys, desired, group=group, ttl_s=ttl_s, wait=ACK_TIMEOUT_S)
    return desired
