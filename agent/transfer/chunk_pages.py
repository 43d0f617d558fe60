"""Reading a big bundle's chunk list from its index pages (core/transfer/chunk_index.py), before anything is downloaded.

The offer's counts were checked with the offer (core/transfer/blocks.py `check_layout`), so the pages fetched here are
at most what the signed sizes allow. Each page is decoded within its signed sizes and must hash to its signed name
before a byte of it is read; then the list is decoded, checked as a whole layout (sizes add up to the file) and matched
against the pages once more (`verify`-grade: the expanded offer is what gets stored beside an installed bundle and
re-verified at start-up). A page that does not hash is asked for again; after MAX_CORRUPT tries the published index is
corrupt (TransferError: the host may repair it, the device tries again later).
"""

from __future__ import annotations

import logging
import queue
import time

from edgefleet.agent.transfer.blocks import TransferError
from edgefleet.agent.transfer.link import LinkPacer
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import LayoutError, check_layout
from edgefleet.core.transfer.chunk_index import expand, pages_match
from edgefleet.core.transfer.chunks import ChunkError, decode_chunk

log = logging.getLogger(__name__)

MAX_CORRUPT = 3


def resolve_index(
    conn: Connection,
    topics: Topics,
    offer: BundleOffer,
    *,
    size_limit: int,
    timeout_s: float = 30.0,
    link: LinkPacer | None = None,
) -> BundleOffer:
    """The offer with its chunk list read from its index pages (the offer itself when it lists chunks inline).
    Pages are bundle bytes to the link's cap; `timeout_s` is the longest wait for the next page."""
    transfer = offer.transfer
    if not transfer.index or transfer.chunks:
        return offer
    check_layout(transfer, size_limit)  # the counts again, whoever calls: nothing is fetched for an absurd index
    wanted: dict[str, int] = {}  # topic -> the first page it is (pages may repeat: a file of zeros)
    for first, ref in enumerate(transfer.index):
        wanted.setdefault(topics.chunk(ref.sha256), first)
    inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
    pages: dict[int, bytes] = {}
    strikes = 0
    deadline = time.monotonic() + timeout_s

    def on_page(topic: str, payload: bytes, _retained: bool) -> None:
        inbox.put((topic, payload))

    if link is not None:
        link.acquire_bulk(sum(transfer.index[first].size for first in wanted.values()))
    conn.subscribe_many(list(wanted), on_page)
    try:
        while len(pages) < len(wanted):
            try:
                topic, payload = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TransferError(
                    f"{len(wanted) - len(pages)} of {len(wanted)} index pages of {offer.bundle_id} did not arrive "
                    f"(nothing for {timeout_s:g} s)"
                ) from None
            number = wanted.get(topic)
            if number is None or number in pages:
                continue
            deadline = time.monotonic() + timeout_s
            if link is not None:
                link.bulk_received(len(payload))
            try:
                pages[number] = decode_chunk(transfer.index[number], payload)
            except ChunkError as err:
                strikes += 1
                log.warning("refused index page %d of %s: %s", number, offer.bundle_id, err)
                if strikes >= MAX_CORRUPT:
                    raise TransferError(
                        f"index page {number} of {offer.bundle_id} failed its sha256 {strikes} times; the published "
                        "index is corrupt"
                    ) from err
                conn.unsubscribe(topic)
                conn.subscribe(topic, on_page)  # the retained page again
                continue
            conn.unsubscribe(topic)
    finally:
        conn.unsubscribe_many(list(wanted))
    try:
        ordered = [pages[wanted[topics.chunk(ref.sha256)]] for ref in transfer.index]
        expanded = expand(transfer, ordered)
    except ValueError as err:
        raise LayoutError(f"the signed index of {offer.bundle_id} lists an impossible chunk: {err}") from err
    check_layout(expanded, size_limit)
    if not pages_match(expanded):  # cannot happen for pages that hashed right: kept as the invariant it is
        raise LayoutError(f"the chunk list of {offer.bundle_id} does not re-encode to its signed pages")
    log.info("%s: %d chunks listed on %d index pages", offer.bundle_id, len(expanded.chunks), len(wanted))
    return offer.model_copy(update={"transfer": expanded})


__all__ = ["resolve_index"]
