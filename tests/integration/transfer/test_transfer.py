"""Block transfer over MQTT (the first layout): retained blocks, per-block hashes, a resume fetches what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.agent.transfer.blocks import BlockDownload, TransferError
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

BLOCK = 4096


@pytest.fixture
def device(mosquitto, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    conn = Connection(mosquitto.url, f"test-device-{request.node.name}"[:60]).start()
    yield conn
    conn.stop()


def test_a_download_fetches_every_block_and_checks_the_whole_file(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    bundle = demo_bundles["generic-x86-64"]
    _, offer = publish_bundle(host, topics, bundle, block_size=BLOCK, layout="blocks")
    assert offer.transfer.block_count == -(-bundle.stat().st_size // BLOCK)
    fetched = BlockDownload(device, topics, offer, tmp_path / "b.part").run()
    assert fetched.read_bytes() == bundle.read_bytes()


def test_a_resumed_download_fetches_only_the_missing_blocks(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    bundle = demo_bundles["generic-x86-64"]
    _, offer = publish_bundle(host, topics, bundle, block_size=BLOCK, layout="blocks")
    part = tmp_path / "b.part"
    first = BlockDownload(device, topics, offer, part)
    first._open_record()  # what a crashed earlier run leaves: a record and a partly written file
    data = bundle.read_bytes()
    held = list(range(0, offer.transfer.block_count, 2))
    with part.open("r+b") as handle, first.record_path.open("r+b") as record:
        for index in held:
            first._write_block(handle, record, index, data[index * BLOCK : (index + 1) * BLOCK])

    resumed = BlockDownload(device, topics, offer, part)
    assert resumed.held_blocks() == len(held)
    assert resumed.run().read_bytes() == data
    missing_bytes = len(data) - sum(len(data[i * BLOCK : (i + 1) * BLOCK]) for i in held)
    assert resumed.bytes_received == missing_bytes
    assert resumed.rejected_on_resume == 0


def test_a_resume_rechecks_recorded_blocks_so_a_lost_write_is_fetched_again(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """What a power cut can leave: the record claims blocks whose bytes never reached the disk."""
    bundle = demo_bundles["generic-x86-64"]
    _, offer = publish_bundle(host, topics, bundle, block_size=BLOCK, layout="blocks")
    part = tmp_path / "b.part"
    BlockDownload(device, topics, offer, part)._open_record()
    record = part.with_name(part.name + ".blocks")
    record.write_bytes(b"\x01" * 3 + bytes(offer.transfer.block_count - 3))  # claimed, but all zeros on disk
    resumed = BlockDownload(device, topics, offer, part)
    assert resumed.run().read_bytes() == bundle.read_bytes()
    assert resumed.rejected_on_resume == 3


def test_a_corrupt_block_is_never_accepted(
    host: Connection, device: Connection, topics: Topics, demo_bundles: dict[str, Path], tmp_path: Path
) -> None:
    bundle = demo_bundles["generic-x86-64"]
    manifest, offer = publish_bundle(host, topics, bundle, block_size=BLOCK, layout="blocks")
    host.publish(topics.bundle_block(manifest.bundle_id, 1), b"\x00" * BLOCK, qos=1, retain=True, wait=5)
    fetch = BlockDownload(device, topics, offer, tmp_path / "b.part", stall_timeout_s=1.0, max_stalls=1)
    with pytest.raises(TransferError):
        fetch.run()
    assert fetch.corrupt_blocks >= 1
    assert fetch.record_path.read_bytes()[1] == 0, "the corrupt block is not recorded as held"
    # Once the host republishes the right block, the same download completes.
    publish_bundle(host, topics, bundle, block_size=BLOCK, layout="blocks")
    assert BlockDownload(device, topics, offer, tmp_path / "b.part").run().read_bytes() == bundle.read_bytes()
