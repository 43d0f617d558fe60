"""Publishing a bundle as content-addressed chunks, skipping chunks already on the broker, and retention.

The broker itself is the record of what was published: every retained offer lists its chunks, and an offer goes out
only after all of its chunks were acknowledged. So before publishing, the host reads the retained offers (they
arrive before a marker this connection publishes after subscribing, as in control/broker/janitor.py) and
publishes only the chunks none of them lists. Retention is the same read: unpublishing a bundle clears its offer
and every chunk that no remaining offer lists.

A chunk list too long for one offer (core/transfer/chunk_index.py) goes out as index pages, published as chunks after
the chunks they list; an offer's pages count as chunks it lists, and the chunks they list are read back from the broker
(`expand_offers`) wherever the host needs to know what an offer lists.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as paho

from edgefleet.control.broker.retained import read_retained
from edgefleet.control.publish.chunker import MIN_SAVING, encode, iter_chunks
from edgefleet.core.errors import BrokerError, BundleError
from edgefleet.core.messages import BundleOffer, ChunkRef, MessageError, Transfer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.chunk_index import INLINE_MAX, encode_pages, expand, max_chunks, needs_index, page_refs
from edgefleet.core.transfer.chunks import ChunkError, decode_chunk, wire_size

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
WINDOW = 64  # unacknowledged chunks in flight: bounds host memory


@dataclass
class ChunkedPublish:
    """What one publish did: the chunk list for the offer and what went on the wire."""

    chunks: list[ChunkRef] = field(default_factory=list)
    published: int = 0
    published_bytes: int = 0
    skipped: int = 0  # chunks already retained on the broker (listed by an offer published before)
    sha256: str = ""  # of the whole file, from the very bytes that were cut
    index: list[ChunkRef] = field(default_factory=list)  # the index pages, when the list is too long to inline

    def transfer(self, size: int, max_size: int) -> Transfer:
        """The layout the offer signs: the chunks inline, or the index pages and the chunk count."""
        if self.index:
            return Transfer(size=size, sha256=self.sha256, block_size=max_size, index=self.index,
                            chunk_count=len(self.chunks))  # fmt: skip
        return Transfer(size=size, sha256=self.sha256, block_size=max_size, chunks=self.chunks)


def retained_offers(conn: Connection, topics: Topics, timeout: float = READ_TIMEOUT_S) -> dict[str, BundleOffer]:
    """Every offer retained on the broker, by bundle id, paged lists read back where their pages can be read (an
    offer whose pages cannot keeps only its pages: for dedupe that costs a chunk published again, never one lost)."""
    offers = _read_offers(conn, topics, timeout)
    return expand_offers(conn, topics, offers, timeout, lenient=frozenset(offers))


def _read_offers(conn: Connection, topics: Topics, timeout: float) -> dict[str, BundleOffer]:
    """The retained offers as they are on the broker (malformed ones are skipped)."""
    pattern = topics.bundle_offer("x").rsplit("/", 2)[0] + "/+/manifest"
    payloads, complete = read_retained(conn, topics.prefix, [pattern], timeout)
    if not complete:
        raise BrokerError(f"could not read the retained offers within {timeout:g} s")
    offers: dict[str, BundleOffer] = {}
    for topic, payload in payloads.items():
        try:
            offer = decode(BundleOffer, payload)
        except MessageError as err:
            log.debug("ignoring a malformed retained offer on %s: %s", topic, err)  # not ours to report
            continue
        offers[offer.bundle_id] = offer
    return offers


def expand_offers(
    conn: Connection,
    topics: Topics,
    offers: dict[str, BundleOffer],
    timeout: float = READ_TIMEOUT_S,
    *,
    lenient: frozenset[str] = frozenset(),
) -> dict[str, BundleOffer]:
    """The offers with each paged chunk list read from its retained pages (each checked against the page's
    name). BrokerError when a page is missing or wrong: what that offer lists is then unknown, and neither dedupe
    nor retention may guess (`edgefleet publish --republish` that bundle repairs it); an offer in `lenient` then
    keeps only its pages."""
    paged = {ref.sha256: ref for offer in offers.values() if not offer.transfer.chunks for ref in offer.transfer.index}
    if not paged:
        return offers
    payloads, complete = read_retained(conn, topics.prefix, [topics.chunk(sha) for sha in paged], timeout)
    if not complete:
        raise BrokerError(f"could not read the retained index pages within {timeout:g} s")
    expanded = dict(offers)
    for bundle_id, offer in offers.items():
        if offer.transfer.chunks or not offer.transfer.index:
            continue
        try:
            pages = [decode_chunk(ref, payloads.get(topics.chunk(ref.sha256), b"")) for ref in offer.transfer.index]
            expanded[bundle_id] = offer.model_copy(update={"transfer": expand(offer.transfer, pages)})
        except (ChunkError, ValueError) as err:
            if bundle_id not in lenient:
                raise BrokerError(f"the index of {bundle_id} cannot be read from the broker: {err}") from err
            log.warning("the index of %s cannot be read from the broker: %s", bundle_id, err)
    return expanded


def referenced_chunks(offers: dict[str, BundleOffer]) -> dict[str, ChunkRef]:
    """Every chunk some offer lists (its index pages included), by name, as that offer describes it on the wire."""
    return {ref.sha256: ref for offer in offers.values() for ref in [*offer.transfer.chunks, *offer.transfer.index]}


def publish_chunks(
    conn: Connection,
    topics: Topics,
    bundle: Path,
    *,
    max_size: int,
    known: dict[str, ChunkRef],
    min_saving: float = MIN_SAVING,
    inline_max: int = INLINE_MAX,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> ChunkedPublish:
    """Cut, compress and publish (retained, QoS 1) the chunks of `bundle` that `known` lacks, with at most WINDOW
    unacknowledged; a chunk `known` lists keeps the description (raw or zstd) it was published with. A list
    longer than `inline_max` bytes inline is published as index pages too (last, after the chunks they list)."""
    result = ChunkedPublish()
    in_flight: deque[paho.MQTTMessageInfo] = deque()
    seen, reused = dict(known), set()
    whole = hashlib.sha256()
    total = bundle.stat().st_size
    with ThreadPoolExecutor(1) as hasher:  # the whole-file sha256 in order, beside the cutting (hashlib frees the GIL)
        for piece, data in iter_chunks(bundle, max_size):
            hasher.submit(whole.update, data)
            sha = hashlib.sha256(data).hexdigest()
            ref = seen.get(sha)
            if ref is None:
                frame = encode(data, min_saving=min_saving)
                ref = ChunkRef(sha256=sha, size=len(data), zstd=len(frame) if frame is not None else None)
                in_flight.append(conn.publish(topics.chunk(sha), frame or bytes(data), qos=1, retain=True))
                result.published += 1
                result.published_bytes += wire_size(ref)
                seen[sha] = ref
            elif sha in known and sha not in reused:
                reused.add(sha)
                result.skipped += 1
            result.chunks.append(ref)
            while len(in_flight) >= WINDOW:
                _wait(in_flight.popleft())
            progress(piece.offset + piece.size, total)
    while in_flight:
        _wait(in_flight.popleft())
    result.sha256 = whole.hexdigest()
    if needs_index(result.chunks, inline_max):
        result.index = _publish_pages(conn, topics, result, known, max_size, bundle.stat().st_size)
    return result


def _publish_pages(
    conn: Connection, topics: Topics, result: ChunkedPublish, known: dict[str, ChunkRef], max_size: int, size: int
) -> list[ChunkRef]:
    """The chunk list as index pages of at most one chunk each, retained like chunks (those not on the broker)."""
    if len(result.chunks) > max_chunks(size):
        raise BundleError(
            f"{len(result.chunks)} chunks for {size} bytes: more than the {max_chunks(size)} a device accepts "
            "(publish it with --layout blocks)"
        )
    pages = encode_pages(result.chunks, max_size)
    refs = page_refs(pages)
    infos = [conn.publish(topics.chunk(ref.sha256), page, qos=1, retain=True)
             for ref, page in zip(refs, pages, strict=True) if ref.sha256 not in known]  # fmt: skip
    for info in infos:
        _wait(info)
    result.published += len(infos)
    result.published_bytes += sum(ref.size for ref in refs if ref.sha256 not in known)
    return refs


def unpublish_bundle(conn: Connection, topics: Topics, bundle_id: str, *, timeout: float = READ_TIMEOUT_S) -> list[str]:
    """Clear a bundle's retained offer, then every chunk no other retained offer lists; the chunks cleared."""
    offers = _read_offers(conn, topics, timeout)
    offers = expand_offers(conn, topics, offers, timeout, lenient=frozenset({bundle_id}))  # the others: read whole
    gone = offers.pop(bundle_id, None)
    conn.publish(topics.bundle_offer(bundle_id), b"", qos=1, retain=True, wait=ACK_TIMEOUT_S)
    if gone is None:
        return []
    still = referenced_chunks(offers)
    orphans = sorted(set(referenced_chunks({bundle_id: gone})) - set(still))
    cleared = [topics.bundle_block(bundle_id, i) for i in range(gone.transfer.block_count)]  # a block layout's
    cleared += [topics.chunk(sha) for sha in orphans]
    for info in [conn.publish(topic, b"", qos=1, retain=True) for topic in cleared]:
        _wait(info)
    log.info("unpublished %s: %d chunks no other bundle lists were cleared", bundle_id, len(orphans))
    return orphans


def _wait(info: paho.MQTTMessageInfo) -> None:
    info.wait_for_publish(ACK_TIMEOUT_S)
    if not info.is_published():
        raise BrokerError(f"the broker did not acknowledge a chunk within {ACK_TIMEOUT_S:g} s")


__all__ = [
    "ChunkedPublish",
    "expand_offers",
    "publish_chunks",
    "referenced_chunks",
    "retained_offers",
    "unpublish_bundle",
]
