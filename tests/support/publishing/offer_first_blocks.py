"""Publishing a bundle with its signed offer FIRST, so devices fetch while the blocks are still going out.

`publish_bundle` (control/publish/publisher.py) sends the offer last, so a device that sees it finds every block
retained. Here the layout is hashed in one pass, the offer is signed and published, then the blocks follow: a device
that is already waiting subscribes to its window of block topics and receives each block as it is published (a block
that is not there yet is simply waited for, within the downloader's stall timeout). End to end, publishing and fetching
overlap instead of adding up. Blocks are retained as always, so a device that comes later fetches the same way.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

import paho.mqtt.client as paho

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.publish.publisher import ACK_TIMEOUT_S, WINDOW, _wait
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE, describe_transfer, iter_blocks, sign_offer

log = logging.getLogger(__name__)


def publish_offer_first(
    conn: Connection,
    topics: Topics,
    bundle: Path,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    keys: HostKeys | None = None,
) -> tuple[Manifest, BundleOffer]:
    keys = keys or HostKeys.default()
    key, keyset = keys.bundle_key(), keys.keyset()
    signed = read_signed_manifest(bundle)
    manifest = parse_manifest(signed.manifest_json)
    transfer = describe_transfer(bundle, block_size)  # one pass: every block hash and the whole-file hash
    offer = sign_offer(manifest.bundle_id, signed.manifest_json, transfer, key, keyset)
    conn.publish(topics.bundle_offer(manifest.bundle_id), offer.encode(), qos=1, retain=True, wait=ACK_TIMEOUT_S)
    in_flight: deque[paho.MQTTMessageInfo] = deque()
    for index, block in enumerate(iter_blocks(bundle, block_size)):
        in_flight.append(conn.publish(topics.bundle_block(manifest.bundle_id, index), block, qos=1, retain=True))
        while len(in_flight) >= WINDOW:
            _wait(in_flight.popleft())
    while in_flight:
        _wait(in_flight.popleft())
    log.info("published %s offer first: %d bytes in %d blocks", manifest.bundle_id, transfer.size, transfer.block_count)
    return manifest, offer
