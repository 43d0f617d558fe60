"""A chunked bundle published offer first: a waiting device fetches while the chunks go out; the retained offer
still goes out last, so the broker's record of what is published never names a chunk it lacks."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pytest

from edgefleet.agent.transfer.chunks import ChunkDownload
from edgefleet.control.publish.chunks import referenced_chunks, retained_offers
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.messages import BundleOffer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import bundle_with
from support.publishing.offer_first_chunks import plan_chunks, publish_chunked_early


@pytest.fixture
def device(mosquitto, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    conn = Connection(mosquitto.url, f"test-device-{request.node.name}"[:60]).start()
    yield conn
    conn.stop()


def _bundle(source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str, seed: int) -> Path:
    """A bundle of its own (its own id and random weights), with a golden file that compresses."""
    text = b"".join(b"golden row %06d: 0.125 0.5 0.25\n" % i for i in range(20000))
    weights = np.random.default_rng(seed).bytes(2_000_000)
    return bundle_with(source, out, key, trusted, version, {"extra/weights.bin": weights, "extra/golden.txt": text})


def _waiting_device(device: Connection, topics: Topics, bundle_id: str) -> queue.Queue[tuple[bytes, bool]]:
    offers: queue.Queue[tuple[bytes, bool]] = queue.Queue()
    subscribed = threading.Event()
    device.subscribe(f"test/settle/{bundle_id}", lambda t, p, r: subscribed.set())
    device.subscribe(topics.bundle_offer(bundle_id), lambda t, p, r: offers.put((p, r)))
    device.publish(f"test/settle/{bundle_id}", b"x", qos=1)  # comes back once both subscriptions are in place
    assert subscribed.wait(30)
    return offers


def test_a_waiting_device_fetches_chunks_published_offer_first(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    bundle = _bundle(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "71.1", seed=31)
    bundle_id = parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id
    offers = _waiting_device(device, topics, bundle_id)
    fetched: dict[str, object] = {}

    def fetch() -> None:
        try:
            payload, retained = offers.get(timeout=60)
            fetched["live"] = not retained
            offer = decode(BundleOffer, payload)
            fetched["path"] = ChunkDownload(device, topics, offer, tmp_path / "c.part", stall_timeout_s=10).run()
        except BaseException as err:
            fetched["error"] = err

    worker = threading.Thread(target=fetch)
    worker.start()
    _, offer = publish_chunked_early(host, topics, bundle)
    worker.join(120)
    assert "error" not in fetched, fetched.get("error")
    assert fetched["live"] is True, "the device started on the live offer, not on a retained one"
    path = fetched["path"]
    assert isinstance(path, Path) and path.read_bytes() == bundle.read_bytes()
    assert offer.transfer.chunks and not offer.transfer.index
    assert any(ref.zstd for ref in offer.transfer.chunks), "the golden text travels compressed"
    on_broker = retained_offers(host, topics)
    assert on_broker[bundle_id].transfer == offer.transfer, "the retained offer went out once the chunks were acked"


def test_a_device_that_comes_later_fetches_from_the_retained_offer_and_nothing_is_sent_twice(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path,
    signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    bundle = _bundle(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "71.2", seed=32)
    bundle_id = parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id
    _, published = publish_chunked_early(host, topics, bundle)
    offers: queue.Queue[tuple[bytes, bool]] = queue.Queue()
    device.subscribe(topics.bundle_offer(bundle_id), lambda t, p, r: offers.put((p, r)))
    payload, retained = offers.get(timeout=30)
    assert retained
    offer = decode(BundleOffer, payload)
    assert offer == published
    path = ChunkDownload(device, topics, offer, tmp_path / "d.part", stall_timeout_s=10).run()
    assert path.read_bytes() == bundle.read_bytes()
    again = plan_chunks(bundle, offer.transfer.block_size, referenced_chunks(retained_offers(host, topics)))
    assert again.payloads == {}, "every chunk is already retained: a second publish sends none"
    assert again.chunks == offer.transfer.chunks
