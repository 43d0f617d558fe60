"""Publishing the signed offer first: a device already waiting fetches while the blocks go out."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from edgefleet.agent.transfer.blocks import BlockDownload, TransferError
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.messages import BundleOffer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.publishing.offer_first_blocks import publish_offer_first

BLOCK = 4096


@pytest.fixture
def device(mosquitto, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    conn = Connection(mosquitto.url, f"test-device-{request.node.name}"[:60]).start()
    yield conn
    conn.stop()


def test_a_waiting_device_fetches_a_bundle_published_offer_first(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    bundle = demo_bundles["generic-x86-64"]
    bundle_id = parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id
    offers: queue.Queue[bytes] = queue.Queue()
    subscribed = threading.Event()
    device.subscribe(f"test/settle/{bundle_id}", lambda t, p, r: subscribed.set())
    # Only the live offer: the session's broker may still retain this bundle's offer from an earlier test, in
    # another layout (a block download refuses a chunked offer: test_a_block_download_refuses_a_chunked_offer).
    device.subscribe(topics.bundle_offer(bundle_id), lambda t, p, r: None if r else offers.put(p))
    device.publish(f"test/settle/{bundle_id}", b"x", qos=1)  # comes back once both subscriptions are in place
    assert subscribed.wait(30)
    fetched: dict[str, Path | BaseException] = {}

    def fetch() -> None:
        try:
            offer = decode(BundleOffer, offers.get(timeout=60))
            fetched["path"] = BlockDownload(device, topics, offer, tmp_path / "b.part", stall_timeout_s=5).run()
        except BaseException as err:
            fetched["error"] = err

    worker = threading.Thread(target=fetch)
    worker.start()
    _, offer = publish_offer_first(host, topics, bundle, block_size=BLOCK)
    worker.join(120)
    assert "error" not in fetched, fetched.get("error")
    path = fetched["path"]
    assert isinstance(path, Path) and path.read_bytes() == bundle.read_bytes()
    assert offer.transfer.block_count == -(-bundle.stat().st_size // BLOCK)


def test_a_block_download_refuses_a_chunked_offer(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """Its block list is empty, so fetching nothing it would hand on a file of zeros: it refuses the offer instead,
    and writes nothing (the agent picks the download by the offer's layout: agent/transfer/chunks.py open_download)."""
    _, offer = publish_bundle(host, topics, demo_bundles["generic-x86-64"])
    assert offer.transfer.chunks
    with pytest.raises(TransferError, match="lists chunks, not blocks: a block download refuses it"):
        BlockDownload(device, topics, offer, tmp_path / "c.part")
    assert list(tmp_path.iterdir()) == []
