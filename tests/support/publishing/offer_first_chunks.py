"""Publishing a chunked bundle so that devices already waiting fetch while its chunks go out.

`publish_bundle` (control/publish/publisher.py) cuts, publishes the chunks, then the retained offer: end to end, the
device's fetch only starts once the host has sent everything, so publishing and fetching add up. Here the host first
plans the whole layout in memory (cut, hash, zstd decided: the chunk list the offer signs), then publishes the signed
offer NOT retained, so a device that is subscribed to the offer topic now starts fetching at once: each chunk it
subscribes to arrives when the host publishes it (or at once, when it is already retained). The chunks go out retained
as always and the same offer is then published retained, last, only after every chunk was acknowledged: the rule the
dedupe and retention read (control/publish/chunks.py: a retained offer means its chunks are on the broker) holds
unchanged, and a host that dies half way leaves no retained offer behind.

The plan keeps every new chunk's bytes in memory between the cut and the send (no second read: a file that changed
in between cannot go out under a stale name), so only bundles up to `EARLY_MAX` bytes whose chunk list fits inline
go this way; others fall back to `publish_bundle`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as paho

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.publish.chunker import MIN_SAVING, encode, iter_chunks
from edgefleet.control.publish.chunks import ACK_TIMEOUT_S, WINDOW, _wait, referenced_chunks, retained_offers
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import BundleOffer, ChunkRef, Transfer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE, sign_offer
from edgefleet.core.transfer.chunk_index import needs_index

log = logging.getLogger(__name__)

EARLY_MAX = 256 << 20  # bytes of bundle held in memory between the plan and the sends


@dataclass
class Plan:
    """The chunk list the offer signs, the whole-file sha256, and the payload of each chunk the broker lacks."""

    chunks: list[ChunkRef] = field(default_factory=list)
    sha256: str = ""
    payloads: dict[str, bytes | memoryview] = field(default_factory=dict)  # in file order (first occurrence)


def plan_chunks(bundle: Path, max_size: int, known: dict[str, ChunkRef], min_saving: float = MIN_SAVING) -> Plan:
    """Cut and describe `bundle`; a chunk `known` lists keeps its description and is not sent again."""
    plan, whole, seen = Plan(), hashlib.sha256(), dict(known)
    for _, data in iter_chunks(bundle, max_size):
        whole.update(data)
        sha = hashlib.sha256(data).hexdigest()
        ref = seen.get(sha)
        if ref is None:  # new to the broker (and the first time this file holds it)
            frame = encode(data, min_saving=min_saving)
            ref = seen[sha] = ChunkRef(sha256=sha, size=len(data), zstd=len(frame) if frame is not None else None)
            plan.payloads[sha] = frame if frame is not None else data
        plan.chunks.append(ref)
    plan.sha256 = whole.hexdigest()
    return plan


def publish_chunked_early(
    conn: Connection,
    topics: Topics,
    bundle: Path,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    keys: HostKeys | None = None,
) -> tuple[Manifest, BundleOffer]:
    """The offer live first, the new chunks retained, the offer retained last (see the module docstring)."""
    size = bundle.stat().st_size
    if size > EARLY_MAX:
        return publish_bundle(conn, topics, bundle, block_size=block_size, keys=keys, layout="chunks")
    keys = keys or HostKeys.default()
    key, keyset = keys.bundle_key(), keys.keyset()
    signed = read_signed_manifest(bundle)
    manifest = parse_manifest(signed.manifest_json)
    plan = plan_chunks(bundle, block_size, referenced_chunks(retained_offers(conn, topics)))
    if needs_index(plan.chunks):  # a list on index pages: those go out after the chunks, so the offer does too
        return publish_bundle(conn, topics, bundle, block_size=block_size, keys=keys, layout="chunks")
    transfer = Transfer(size=size, sha256=plan.sha256, block_size=block_size, chunks=plan.chunks)
    offer = sign_offer(manifest.bundle_id, signed.manifest_json, transfer, key, keyset)
    payload = offer.encode()
    topic = topics.bundle_offer(manifest.bundle_id)
    conn.publish(topic, payload, qos=1, retain=False, wait=ACK_TIMEOUT_S)  # devices waiting start fetching now
    in_flight: deque[paho.MQTTMessageInfo] = deque()
    for sha, data in plan.payloads.items():
        in_flight.append(conn.publish(topics.chunk(sha), bytes(data), qos=1, retain=True))
        while len(in_flight) >= WINDOW:
            _wait(in_flight.popleft())
    while in_flight:
        _wait(in_flight.popleft())
    conn.publish(topic, payload, qos=1, retain=True, wait=ACK_TIMEOUT_S)  # every chunk is on the broker
    log.info("published %s offer first: %d bytes in %d chunks, %d sent", manifest.bundle_id, size,
             len(plan.chunks), len(plan.payloads))  # fmt: skip
    return manifest, offer


__all__ = ["EARLY_MAX", "Plan", "plan_chunks", "publish_chunked_early"]
