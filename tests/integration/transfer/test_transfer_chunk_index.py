"""Offers for big bundles: a chunk list too long for one MQTT message travels as index pages (content-addressed
chunks themselves), and the signed offer lists only the pages, so it stays small whatever the bundle's size.

Against a real Mosquitto with the shipped `max_packet_size` (deploy/fleet/mosquitto.conf) and real agent
processes: a paged bundle is offered, fetched, verified, installed and resumed after kill -9; a tampered page is
refused before a byte of it is trusted; an index claiming absurd counts is refused before anything is fetched.
Small bundles keep the inline offer agents from before pages parse."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgefleet.agent.transfer.chunk_pages import resolve_index
from edgefleet.agent.transfer.chunks import ChunkDownload
from edgefleet.control.broker.retained import read_retained
from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.publish.chunker import chunk_names
from edgefleet.control.publish.chunks import (
    expand_offers,
    publish_chunks,
    referenced_chunks,
    retained_offers,
    unpublish_bundle,
)
from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.bundle.archive import parse_manifest
from edgefleet.core.errors import SignatureError
from edgefleet.core.messages import BundleOffer, ChunkRef, Transfer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE, LayoutError, check_layout, sign_offer, verify_offer
from edgefleet.core.transfer.chunk_index import ENTRY, INLINE_MAX, encode_pages, inline_size, max_chunks, page_refs
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, bundle_with
from support.paths import REPO
from support.servers.brokers import MosquittoBroker

SHIPPED_CONF = REPO / "deploy" / "fleet" / "mosquitto.conf"
MAX_PACKET = int(re.search(r"^max_packet_size (\d+)", SHIPPED_CONF.read_text(), re.M)[1])  # type: ignore[index]
AWS_IOT_MAX = 128 * 1024
PAGED_BLOCK = 4096  # small chunks, so a 3 MB bundle's list outgrows an inline offer (as a ~50 MB one does at 128 KiB)
WEIGHTS = 3_000_000
StartAgent = Callable[..., AgentProcess]


@pytest.fixture(scope="module")
def mosquitto() -> Iterator[MosquittoBroker]:
    """Mosquitto refusing packets over the shipped limit, as the fleet broker does."""
    with MosquittoBroker(extra_config=[f"max_packet_size {MAX_PACKET}"]) as broker:
        yield broker


def big(source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str, seed: int) -> Path:
    return bundle_with(source, out, key, trusted, version,
                       {"extra/weights.bin": np.random.default_rng(seed).bytes(WEIGHTS)})  # fmt: skip


def expanded(host: Connection, topics: Topics, offer: BundleOffer) -> list[ChunkRef]:
    return expand_offers(host, topics, {offer.bundle_id: offer})[offer.bundle_id].transfer.chunks


def test_a_bundle_whose_chunk_list_outgrows_an_offer_is_offered_on_index_pages_and_installed_across_a_kill_9(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """Two chunks are withheld, so the download is caught in the middle for sure; after kill -9 and a restart the
    agent reads the pages again and fetches only what it lacked."""
    bundle = big(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, "31", 31)
    manifest, offer = publish_bundle(host, topics, bundle, block_size=PAGED_BLOCK)
    chunks = expanded(host, topics, offer)
    assert offer.transfer.index and not offer.transfer.chunks
    assert offer.transfer.chunk_count == len(chunks) and sum(ref.size for ref in chunks) == bundle.stat().st_size
    assert inline_size(chunks) > INLINE_MAX, "inline, this list would have made the offer too big"
    layout = len(offer.transfer.model_dump_json())
    assert layout < 120 * len(offer.transfer.index) + 200, f"the paged layout takes {layout} bytes of the offer"
    assert len(offer.encode()) < min(AWS_IOT_MAX, MAX_PACKET)
    assert all(page.size <= PAGED_BLOCK for page in offer.transfer.index)
    assert len(offer.transfer.index) >= 3
    withheld = [ref for ref in chunks if ref.size == PAGED_BLOCK][100:102]
    for ref in withheld:
        host.publish(topics.chunk(ref.sha256), b"", qos=1, retain=True, wait=5)
    agent = start_agent("dev-paged")
    deploy(host, topics, manifest, devices=["dev-paged"], groups=[])
    record = agent.state_dir / "slots" / "default" / "downloads" / f"{offer.bundle_id}.part.blocks"
    total = len(chunks)
    watcher.wait_for("all but the withheld two", lambda: record.exists() and sum(record.read_bytes()) == total - 2, 90)
    agent.kill9()
    marker = len(watcher.events)
    publish_bundle(host, topics, bundle, block_size=PAGED_BLOCK, republish=True)  # the withheld chunks are back
    agent.start()
    watcher.serving("dev-paged", offer.bundle_id, timeout=120)
    resumed = next(e for e in watcher.events[marker:] if e.kind == "downloaded" and e.bundle_id == offer.bundle_id)
    fetched = int(re.search(r"in (\d+) chunks", resumed.detail)[1])  # type: ignore[index]
    assert fetched <= 2 + 1, f"the resume fetched {fetched} chunks; it lacked 2 ({resumed.detail})"
    watcher.event("dev-paged", "committed", bundle_id=offer.bundle_id)
    stored = json.loads((agent.state_dir / "bundles" / offer.bundle_id / "chunks.json").read_text())
    assert len(stored["chunks"]) > total // 2, "the installed bundle's chunk index serves the next delta"
    agent.stop()
    watcher.wait_for("offline", lambda: not watcher.status["dev-paged"].online, 30)
    marker = len(watcher.events)
    agent.start()  # start-up re-verifies the stored offer: its chunk list against the signed pages
    watcher.serving("dev-paged", offer.bundle_id, timeout=60)
    assert not [e for e in watcher.events[marker:] if e.kind in ("error", "refused", "rolled-back")]


def test_the_offer_of_the_biggest_bundle_a_profile_allows_fits_one_message_whatever_its_chunk_count(
    host_keys: HostKeys,
) -> None:
    """2,000 MB (the largest size_limit_mb of the shipped profiles) cut into as many chunks as a device accepts,
    at the default 128 KiB: the offer lists the pages and stays under both limits; inline it would be ~200 MB."""
    size = 2000 * 10**6
    count = max_chunks(size)
    per_page = DEFAULT_BLOCK_SIZE // ENTRY.size
    sizes = [per_page * ENTRY.size] * (count // per_page) + [(count % per_page) * ENTRY.size]
    index = [ChunkRef(sha256=hashlib.sha256(b"%d" % i).hexdigest(), size=n) for i, n in enumerate(sizes)]
    transfer = Transfer(size=size, sha256="a" * 64, block_size=DEFAULT_BLOCK_SIZE, index=index, chunk_count=count)
    offer = sign_offer("b-huge", "{}", transfer, host_keys.bundle_key(), host_keys.keyset())
    check_layout(transfer, size_limit=size)
    print(f"{count} chunks on {len(index)} pages: offer {len(offer.encode())} bytes")
    assert len(offer.encode()) < min(AWS_IOT_MAX, MAX_PACKET), f"{len(offer.encode())} bytes"
    sample = [ChunkRef(sha256=hashlib.sha256(b"%d" % i).hexdigest(), size=65536, zstd=60000) for i in range(100)]
    assert inline_size(sample) * count // 100 > 100 * MAX_PACKET, "inline, the list would be far past the limit"


def test_a_small_bundle_keeps_the_inline_offer_that_agents_from_before_pages_parse(
    host: Connection, topics: Topics, demo_bundles: dict[str, Path]
) -> None:
    _, offer = publish_bundle(host, topics, demo_bundles["intel-x86-vnni"])
    payload = json.loads(offer.encode())
    assert offer.transfer.chunks
    assert set(payload["transfer"]) == {"schema_version", "size", "sha256", "block_size", "block_sha256", "chunks"}
    assert BundleOffer.model_validate(payload) == offer


@pytest.mark.slow
def test_a_tampered_index_page_is_refused_before_a_byte_of_it_is_trusted(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
    attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    """Someone with write access to the broker rewrites a retained index page so that one entry names a chunk of
    their own (same length, so only the hash can tell). The device refuses the page, allocates nothing and installs
    nothing; once the host republishes, the same device installs the real bundle."""
    bundle = big(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, "32", 32)
    manifest, offer = publish_bundle(host, topics, bundle, block_size=PAGED_BLOCK)
    page_ref = offer.transfer.index[1]
    page = bytearray(retained(host, topics, page_ref))
    entry = next(i for i in range(0, len(page), ENTRY.size) if ENTRY.unpack_from(page, i)[2] == 0)  # a raw chunk
    _sha, size, _raw = ENTRY.unpack_from(page, entry)
    evil = b"evil payload".ljust(size, b"!")
    host.publish(topics.chunk(hashlib.sha256(evil).hexdigest()), evil, qos=1, retain=True, wait=5)
    page[entry : entry + ENTRY.size] = ENTRY.pack(hashlib.sha256(evil).digest(), size, 0)
    host.publish(topics.chunk(page_ref.sha256), bytes(page), qos=1, retain=True, wait=5)
    agent = start_agent("dev-tamper")
    deploy(host, topics, manifest, devices=["dev-tamper"], groups=[])
    error = watcher.event("dev-tamper", "error", bundle_id=offer.bundle_id, timeout=60)
    downloads = agent.state_dir / "slots" / "default" / "downloads"
    allocated = list(downloads.glob(f"{offer.bundle_id}.part*")) if downloads.exists() else []
    installed = (agent.state_dir / "bundles" / offer.bundle_id).exists()
    assert not attack_ledger.record(
        "a rewritten index page naming an attacker's chunk",
        succeeded=installed or bool(allocated) or "index page" not in error.detail,
        detail=f"refused: {error.detail[:120]}; nothing allocated",
    )
    publish_bundle(host, topics, bundle, block_size=PAGED_BLOCK, republish=True)  # the host repairs its pages
    watcher.serving("dev-tamper", offer.bundle_id, timeout=120)


def retained(host: Connection, topics: Topics, ref: ChunkRef) -> bytes:
    payloads, complete = read_retained(host, topics.prefix, [topics.chunk(ref.sha256)], 10.0)
    assert complete
    return payloads[topics.chunk(ref.sha256)]


def test_an_index_claiming_absurd_counts_is_refused_before_anything_is_fetched(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], host_keys: HostKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    """A publisher bug (or a stolen bundle key): an offer signed by the real key whose index declares 10**12 chunks
    on pages that could hold them. The device refuses it from the counts alone, subscribing to no page."""
    _, real = publish_bundle(host, topics, demo_bundles["generic-x86-64"])
    manifest = parse_manifest(real.manifest_json)
    pages = [ChunkRef(sha256=f"{i:064x}", size=(DEFAULT_BLOCK_SIZE // ENTRY.size) * ENTRY.size) for i in range(3)]
    transfer = real.transfer.model_copy(update={"chunks": [], "index": pages, "chunk_count": 10**12})
    forged = sign_offer(real.bundle_id, real.manifest_json, transfer, host_keys.bundle_key(), host_keys.keyset())
    host.publish(topics.bundle_offer(real.bundle_id), forged.encode(), qos=1, retain=True, wait=5)
    agent = start_agent("dev-absurd", profile="generic-x86-64")
    try:
        deploy(host, topics, manifest, devices=["dev-absurd"], groups=[])
        refused = watcher.event("dev-absurd", "refused", bundle_id=real.bundle_id, timeout=60)
    finally:
        host.publish(topics.bundle_offer(real.bundle_id), real.encode(), qos=1, retain=True, wait=5)
    downloads = agent.state_dir / "slots" / "default" / "downloads"
    allocated = list(downloads.glob("*.part*")) if downloads.exists() else []
    assert not attack_ledger.record(
        "a signed index declaring 10**12 chunks",
        succeeded=bool(allocated) or "impossible chunk index" not in refused.detail,
        detail=f"refused before download: {refused.detail[:120]}",
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"chunk_count": 10**12}, "a device accepts"),
        ({"chunk_count": 5}, "hold 3276 entries"),
        ({"index": [ChunkRef(sha256="c" * 64, size=DEFAULT_BLOCK_SIZE * 2)], "chunk_count": 6553}, "at most a chunk"),
        ({"index": [ChunkRef(sha256="c" * 64, size=41)], "chunk_count": 1}, "whole 40-byte entries"),
        ({"index": [ChunkRef(sha256="c" * 64, size=400, zstd=200)], "chunk_count": 10}, "travel raw"),
        ({"index": [], "chunk_count": 7}, "declares a chunk count"),
    ],
)
def test_index_layouts_that_cannot_be_right_are_refused_from_the_offer_alone(change: dict, problem: str) -> None:
    page = ChunkRef(sha256="c" * 64, size=(DEFAULT_BLOCK_SIZE // ENTRY.size) * ENTRY.size)
    good = Transfer(size=10**8, sha256="a" * 64, block_size=DEFAULT_BLOCK_SIZE, index=[page], chunk_count=3276)
    check_layout(good, size_limit=10**9)
    with pytest.raises(LayoutError, match=problem):
        check_layout(good.model_copy(update=change), size_limit=10**9)


def test_an_inline_list_smuggled_into_a_paged_offer_fails_its_signature(host_keys: HostKeys) -> None:
    """The pages are signed, the inline list is not: a list that is not what the pages hold is refused."""
    refs = [ChunkRef(sha256=f"{i:064x}", size=1000) for i in range(10)]
    index = page_refs(encode_pages(refs, DEFAULT_BLOCK_SIZE))
    transfer = Transfer(size=10_000, sha256="a" * 64, block_size=DEFAULT_BLOCK_SIZE, index=index, chunk_count=10)
    offer = sign_offer("b-1", "{}", transfer, host_keys.bundle_key(), host_keys.keyset())
    trusted = TrustedKeys.load([host_keys.directory / "bundle.pub"])
    verify_offer(offer, trusted)  # as published: the pages alone
    verify_offer(offer.model_copy(update={"transfer": transfer.model_copy(update={"chunks": refs})}), trusted)
    swapped = [refs[1], refs[0], *refs[2:]]
    with pytest.raises(SignatureError, match="index pages"):
        verify_offer(offer.model_copy(update={"transfer": transfer.model_copy(update={"chunks": swapped})}), trusted)


def test_pages_are_chunks_for_dedupe_retention_and_acl_files(
    host: Connection, mosquitto: MosquittoBroker, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """A second version sharing the weights publishes only its own chunks (the first one's list is read from its
    pages); unpublishing the first clears its pages and the chunks only it listed, and the second still fetches
    whole; an acl_file names the pages beside the chunks."""
    weights = np.random.default_rng(33).bytes(WEIGHTS)
    source = demo_bundles["intel-x86-vnni"]
    own = {v: np.random.default_rng(int(v)).bytes(50_000) for v in ("33", "34")}
    one = bundle_with(source, tmp_path, signing_key, trusted, "33", {"extra/w.bin": weights, "extra/o.bin": own["33"]})
    two = bundle_with(source, tmp_path, signing_key, trusted, "34", {"extra/w.bin": weights, "extra/o.bin": own["34"]})
    _, first = publish_bundle(host, topics, one, block_size=PAGED_BLOCK)
    _, second = publish_bundle(host, topics, two, block_size=PAGED_BLOCK)
    offers = retained_offers(host, topics)
    listed_one = set(referenced_chunks({first.bundle_id: offers[first.bundle_id]}))
    listed_two = set(referenced_chunks({second.bundle_id: offers[second.bundle_id]}))
    assert {ref.sha256 for ref in first.transfer.index} <= listed_one
    assert len(listed_one & listed_two) > 600, "the shared weights are the same chunks"
    assert set(chunk_names(two, PAGED_BLOCK)) == listed_two, "an acl_file names every chunk and page of the bundle"
    again = publish_chunks(host, topics, two, max_size=PAGED_BLOCK, known=referenced_chunks(offers))
    assert again.published == 0 and again.index == second.transfer.index, "nothing is published twice, pages neither"
    cleared = set(unpublish_bundle(host, topics, first.bundle_id))
    own_pages = {ref.sha256 for ref in first.transfer.index} - listed_two  # pages of the shared run are shared too
    assert own_pages and own_pages <= cleared, "its own pages go with it"
    assert cleared and not cleared & listed_two, "nothing the other bundle lists is cleared"
    device = Connection(mosquitto.url, "paged-reader").start()
    try:
        full = resolve_index(device, topics, second, size_limit=10**9)
        assert ChunkDownload(device, topics, full, tmp_path / "two.part").run().read_bytes() == two.read_bytes()
    finally:
        device.stop()


@pytest.mark.slow
def test_a_300_mb_bundle_travels_to_a_real_agent_with_an_offer_under_the_broker_limit(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """The defect this layout fixes: at the default 128 KiB chunks, a 300 MB bundle's inline list is several times
    the shipped max_packet_size. Paged, its offer is a few KB and a real agent fetches, verifies and commits it."""
    weights = np.random.default_rng(300).bytes(300 * 10**6)
    bundle = bundle_with(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, "300",
                         {"extra/weights.bin": weights})  # fmt: skip
    del weights
    start = time.monotonic()
    manifest, offer = publish_bundle(host, topics, bundle)
    published = time.monotonic()
    chunks = expanded(host, topics, offer)
    print(f"{bundle.stat().st_size} bytes: {len(chunks)} chunks on {len(offer.transfer.index)} pages; offer "
          f"{len(offer.encode())} bytes, inline it would list {inline_size(chunks)} bytes")  # fmt: skip
    assert inline_size(chunks) > MAX_PACKET, "inline, the broker would refuse this offer"
    assert len(offer.encode()) < min(AWS_IOT_MAX, MAX_PACKET) // 8
    start_agent("dev-300")
    deploy(host, topics, manifest, devices=["dev-300"], groups=[])
    watcher.serving("dev-300", offer.bundle_id, timeout=900)
    done = time.monotonic()
    event = watcher.event("dev-300", "downloaded", bundle_id=offer.bundle_id)
    fetched = int(event.detail.split(" bytes")[0])
    rate = bundle.stat().st_size / (done - published) / 1e6
    print(f"publish {published - start:.1f} s, deploy to serving {done - published:.1f} s ({rate:.1f} MB/s, "
          f"unpack and golden set included); {event.detail}")  # fmt: skip
    assert fetched == sum(ref.zstd or ref.size for ref in {r.sha256: r for r in chunks}.values())


def test_a_simulated_device_reads_the_index_pages_then_the_chunks_they_list(
    mosquitto: MosquittoBroker, host: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    from support.rollouts.control_plane import sim_fleet, wait_until

    bundle = big(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "35", 35)
    manifest, offer = publish_bundle(host, topics, bundle, block_size=PAGED_BLOCK)
    assert offer.transfer.index
    distinct = {ref.sha256: ref for ref in expanded(host, topics, offer)}
    with sim_fleet(mosquitto.url, ["sim-paged"]) as sims:
        deploy(host, topics, manifest, devices=["sim-paged"], groups=[])
        wait_until("the simulated device on the paged bundle",
                   lambda: sims.devices["sim-paged"].active_bundle == offer.bundle_id, 60)  # fmt: skip
        fetched = sims.stats.block_bytes
    assert fetched >= sum(ref.zstd or ref.size for ref in distinct.values()), "every chunk, not just the pages"
