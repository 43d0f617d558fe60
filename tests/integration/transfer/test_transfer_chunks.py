"""Chunked transfer over a real Mosquitto: content-addressed chunks named by their sha256, listed in the signed
offer, compressed where it pays, fetched once, checked one by one (the assembled file is then unpacked against the
signed manifest)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import zstandard

from edgefleet.agent.transfer.blocks import TransferError
from edgefleet.agent.transfer.chunks import ChunkDownload
from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.publish.chunks import publish_chunks, referenced_chunks, retained_offers, unpublish_bundle
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import unpack_pinned
from edgefleet.core.errors import BundleError, SignatureError
from edgefleet.core.messages import BundleOffer, ChunkRef, Transfer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import LayoutError, check_layout, sign_offer, verify_offer
from edgefleet.core.transfer.chunks import ChunkError, decode_chunk
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import bundle_with


@pytest.fixture
def device(mosquitto, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    conn = Connection(mosquitto.url, f"chunk-device-{request.node.name}"[:60]).start()
    yield conn
    conn.stop()


def _random(seed: int, size: int) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).bytes(size)


def test_a_chunked_download_is_the_file_and_a_second_publish_sends_no_chunk_again(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    text = b"".join(b"golden row %06d: 0.125 0.5 0.25\n" % i for i in range(20000))  # compresses well
    bundle = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "11",
                         {"extra/weights.bin": _random(11, 600_000), "extra/golden.txt": text})  # fmt: skip
    _, offer = publish_bundle(host, topics, bundle)
    chunks = offer.transfer.chunks
    assert sum(ref.size for ref in chunks) == bundle.stat().st_size
    assert all(ref.size <= offer.transfer.block_size for ref in chunks)
    assert any(ref.zstd for ref in chunks), "the text compresses, so some chunks travel as zstd"
    assert any(ref.zstd is None and ref.size > 16 * 1024 for ref in chunks), "random bytes travel raw"
    fetch = ChunkDownload(device, topics, offer, tmp_path / "b.part")
    assert fetch.run().read_bytes() == bundle.read_bytes()
    assert fetch.bytes_received == sum(ref.zstd or ref.size for ref in {r.sha256: r for r in chunks}.values())
    again = publish_chunks(host, topics, bundle, max_size=offer.transfer.block_size,
                           known=referenced_chunks(retained_offers(host, topics)))  # fmt: skip
    assert again.published == 0 and again.chunks == chunks and again.sha256 == offer.transfer.sha256


def test_a_corrupt_chunk_is_refused_and_fetched_again_once_repaired(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    bundle = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "12",
                         {"extra/weights.bin": _random(12, 400_000)})  # fmt: skip
    _, offer = publish_bundle(host, topics, bundle)
    victim = next(i for i, ref in enumerate(offer.transfer.chunks) if ref.size > 16 * 1024 and ref.zstd is None)
    ref = offer.transfer.chunks[victim]
    host.publish(topics.chunk(ref.sha256), b"\x00" * ref.size, qos=1, retain=True, wait=5)
    part = tmp_path / "b.part"
    fetch = ChunkDownload(device, topics, offer, part, stall_timeout_s=2.0, max_stalls=1)
    with pytest.raises(TransferError, match="failed its sha256"):
        fetch.run()
    assert fetch.corrupt_blocks >= 1
    assert fetch.record_path.read_bytes()[victim] == 0, "the corrupt chunk is not recorded as held"
    held = sum(fetch.record_path.read_bytes())
    assert held == len(offer.transfer.chunks) - 1, "every other chunk was kept"
    publish_bundle(host, topics, bundle, republish=True)  # the host repairs what it published
    resumed = ChunkDownload(device, topics, offer, part)
    assert resumed.run().read_bytes() == bundle.read_bytes()
    assert resumed.fetched_chunks == 1 and resumed.bytes_received == ref.size


def test_chunks_that_hash_right_but_assemble_wrong_are_refused_before_install(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    host_keys: HostKeys, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """A publisher bug, signed by the real key: two chunks listed in the wrong order. Each chunk is right, the
    file is not. The device hashes each byte once (no whole-file pass: agent/transfer/blocks.py), so the download
    completes; the unpack against the signed manifest (what the agent's `stage` runs before anything is installed)
    refuses the file, and nothing is left in the target folder."""
    bundle = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "13",
                         {"extra/weights.bin": _random(13, 300_000)})  # fmt: skip
    _, offer = publish_bundle(host, topics, bundle)
    chunks = list(offer.transfer.chunks)
    a, b = _two_big(chunks)
    chunks[a], chunks[b] = chunks[b], chunks[a]
    swapped = offer.transfer.model_copy(update={"chunks": chunks})
    check_layout(swapped, size_limit=10**9)  # a possible layout: the sizes still add up
    bad = sign_offer(offer.bundle_id, offer.manifest_json, swapped, host_keys.bundle_key(), host_keys.keyset())
    part = tmp_path / "b.part"
    fetch = ChunkDownload(device, topics, bad, part)
    assembled = fetch.run()
    assert fetch.corrupt_blocks == 0, "every chunk hashed right"
    assert assembled.read_bytes() != bundle.read_bytes(), "the file is not the bundle"
    staging = tmp_path / "staging"
    with pytest.raises(BundleError):
        unpack_pinned(assembled, staging, bad.manifest_json)
    assert not staging.exists(), "nothing unpacked is left"


def _two_big(chunks: list[ChunkRef]) -> tuple[int, int]:
    big = [i for i, ref in enumerate(chunks) if ref.size > 16 * 1024]
    other = next(j for j in big[1:] if chunks[j].size != chunks[big[0]].size)  # swapped, the file changes
    return big[0], other


def test_a_decompression_bomb_on_a_chunk_topic_is_refused_within_the_signed_size(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    """Someone with write access to the broker replaces a compressed chunk by a zstd frame of the same length that
    inflates to 256 MiB. The device reads at most one byte past the chunk's signed size, refuses it, and never
    records it."""
    # random hex: compresses to about half whatever the model looks like, so the largest compressed chunk is big
    # enough to hold the bomb (the model itself differs by the recipe this CPU picked)
    text = _random(14, 200_000).hex().encode()
    bundle = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "14",
                         {"extra/calib.txt": text})  # fmt: skip
    _, offer = publish_bundle(host, topics, bundle)
    victim = max(range(len(offer.transfer.chunks)), key=lambda i: offer.transfer.chunks[i].zstd or 0)
    ref = offer.transfer.chunks[victim]
    assert ref.zstd is not None and ref.zstd > 9000
    bomb = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(256 << 20))
    assert len(bomb) < ref.zstd
    bomb += b"\x00" * (ref.zstd - len(bomb))  # the signed wire length, exactly
    tracemalloc.start()
    with pytest.raises(ChunkError, match="inflates past"):
        decode_chunk(ref, bomb)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    host.publish(topics.chunk(ref.sha256), bomb, qos=1, retain=True, wait=5)
    fetch = ChunkDownload(device, topics, offer, tmp_path / "b.part", stall_timeout_s=2.0, max_stalls=1)
    try:
        with pytest.raises(TransferError, match="failed its sha256"):
            fetch.run()
        recorded = fetch.record_path.read_bytes()[victim]
    finally:
        publish_bundle(host, topics, bundle, republish=True)
    inflated = attack_ledger.record(
        "zstd bomb on a chunk topic",
        succeeded=bool(recorded) or peak > 8 << 20,
        detail=f"256 MiB frame in {ref.zstd} bytes for a {ref.size}-byte chunk: refused, peak {peak >> 10} KiB",
    )
    assert not inflated


def test_unpublishing_a_bundle_clears_only_the_chunks_no_other_published_bundle_lists(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    shared = _random(15, 200_000)
    first = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "15",
                        {"extra/shared.bin": shared, "extra/own.bin": _random(151, 100_000)})  # fmt: skip
    second = bundle_with(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "16",
                         {"extra/shared.bin": shared, "extra/own.bin": _random(161, 100_000)})  # fmt: skip
    _, one = publish_bundle(host, topics, first)
    _, two = publish_bundle(host, topics, second)
    mine = {r.sha256 for r in one.transfer.chunks}
    theirs = {r.sha256 for r in two.transfer.chunks}
    assert len(mine & theirs) >= 4, "the shared file maps to the same chunks in both bundles"
    cleared = unpublish_bundle(host, topics, one.bundle_id)
    assert set(cleared) == mine - theirs - _listed_elsewhere(host, topics)
    assert one.bundle_id not in retained_offers(host, topics)
    assert not _retained(host, topics.chunk(cleared[0])), "an orphan chunk is no longer retained"
    fetch = ChunkDownload(device, topics, two, tmp_path / "two.part")
    assert fetch.run().read_bytes() == second.read_bytes(), "the other bundle still downloads whole"


def _listed_elsewhere(host: Connection, topics: Topics) -> set[str]:
    return set(referenced_chunks(retained_offers(host, topics)))


def _retained(host: Connection, topic: str) -> bool:
    import queue

    box: queue.Queue[bytes] = queue.Queue()
    host.subscribe(topic, lambda _t, payload, retained: box.put(payload) if retained else None)
    try:
        return bool(box.get(timeout=1.0))
    except queue.Empty:
        return False
    finally:
        host.unsubscribe(topic)


def test_chunk_layouts_that_cannot_be_right_are_refused_before_a_byte_is_fetched() -> None:
    sha = "a" * 64

    def transfer(*refs: ChunkRef, size: int) -> Transfer:
        return Transfer(size=size, sha256=sha, block_size=4096, chunks=list(refs))

    with pytest.raises(LayoutError, match="add up"):
        check_layout(transfer(ChunkRef(sha256=sha, size=100), size=101), size_limit=10**6)
    with pytest.raises(LayoutError, match="at most 4096"):
        check_layout(transfer(ChunkRef(sha256=sha, size=5000), size=5000), size_limit=10**6)
    with pytest.raises(LayoutError, match="no smaller compressed"):
        check_layout(transfer(ChunkRef(sha256=sha, size=100, zstd=100), size=100), size_limit=10**6)
    check_layout(transfer(ChunkRef(sha256=sha, size=100, zstd=50), ChunkRef(sha256=sha, size=4096), size=4196),
                 size_limit=10**6)  # fmt: skip


def test_a_block_offer_signed_before_chunks_existed_still_verifies(host_keys: HostKeys) -> None:
    """The chunk list is left out of the signed bytes when empty, so a block-layout offer signs what it always did."""
    transfer = Transfer(size=5000, sha256="b" * 64, block_size=4096, block_sha256=["c" * 64, "d" * 64])
    offer = sign_offer("b-1", "{}", transfer, host_keys.bundle_key(), host_keys.keyset())
    payload = offer.model_dump(mode="json")
    del payload["transfer"]["chunks"]  # what an agent from before chunks received
    old = BundleOffer.model_validate(payload)
    trusted = TrustedKeys.load([host_keys.directory / "bundle.pub"])
    verify_offer(old, trusted)
    with pytest.raises(SignatureError):
        verify_offer(old.model_copy(update={"transfer": transfer.model_copy(update={"chunks": [
            ChunkRef(sha256="c" * 64, size=5000)]})}), trusted)  # fmt: skip
