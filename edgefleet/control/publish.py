"""Publishing a bundle: retained blocks first, then the retained offer (signed manifest + block layout).

Blocks are retained, so a device that comes online days later still finds every block, and a device
that resumes subscribes only to the blocks it lacks. The offer goes last: a device that sees it can
count on every block being there.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

from edgefleet.core.bundle import parse_manifest, read_signed_manifest
from edgefleet.core.errors import BrokerError, BundleError
from edgefleet.core.manifest import Manifest
from edgefleet.core.messages import BundleOffer, Desired, Transfer
from edgefleet.core.mqtt import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer import DEFAULT_BLOCK_SIZE, iter_blocks

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
) -> tuple[Manifest, BundleOffer]:
    signed = read_signed_manifest(bundle)
    # Parsing (not verifying: the host may not hold the device keys) catches a malformed manifest early.
    manifest = parse_manifest(signed.manifest_json)
    total = max(1, -(-bundle.stat().st_size // block_size))
    whole = hashlib.sha256()
    block_hashes: list[str] = []
    in_flight: deque[paho.MQTTMessageInfo] = deque()
    # One pass over the file: hash and publish each block, with at most WINDOW unacknowledged (a sliding
    # window bounds host memory without stalling the pipe the way waiting for whole batches would).
    for index, block in enumerate(iter_blocks(bundle, block_size)):
        whole.update(block)
        block_hashes.append(hashlib.sha256(block).hexdigest())
        in_flight.append(conn.publish(topics.bundle_block(manifest.bundle_id, index), block, qos=1, retain=True))
        while len(in_flight) >= WINDOW:
            _wait(in_flight.popleft())
        progress(index + 1, total)
    while in_flight:
        _wait(in_flight.popleft())
    if not block_hashes:
        raise BundleError(f"{bundle} is empty")
    transfer = Transfer(
        size=bundle.stat().st_size, sha256=whole.hexdigest(), block_size=block_size, block_sha256=block_hashes
    )
    offer = BundleOffer(
        bundle_id=manifest.bundle_id,
        manifest_json=signed.manifest_json,
        key_id=signed.key_id,
        signature=signed.signature,
        transfer=transfer,
    )
    conn.publish(topics.bundle_offer(manifest.bundle_id), offer.encode(), qos=1, retain=True, wait=ACK_TIMEOUT_S)
    log.info("published %s: %d bytes in %d blocks", manifest.bundle_id, transfer.size, transfer.block_count)
    return manifest, offer


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
) -> Desired:
    """Set the desired bundle (retained) for each device and group."""
    desired = Desired(
        bundle_id=manifest.bundle_id,
        model_name=manifest.model_name,
        model_version=manifest.model_version,
        profile=manifest.profile,
        rollback=rollback,
    )
    targets = [topics.device_desired(d) for d in devices] + [topics.group_desired(g) for g in groups]
    for topic in targets:
        conn.publish(topic, desired.encode(), qos=1, retain=True, wait=ACK_TIMEOUT_S)
    return desired
