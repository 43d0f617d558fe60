"""Retention on the broker (`edgefleet unpublish`): a bundle desired state still names is kept; another is cleared
with the chunks no remaining bundle lists, and chunks a remaining bundle shares stay. And `edgefleet deploy
--max-bytes-per-s` signs a paid link's cap into the devices' desired state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefleet.cli.main import main as cli
from edgefleet.control.broker.retained import read_retained
from edgefleet.control.publish.chunks import retained_offers
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.messages import SignedDesired, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import derive_bundle
from support.servers.brokers import MosquittoBroker

PROFILE = "intel-x86-vnni"


def _retained_chunks(conn: Connection, topics: Topics) -> set[str]:
    found, complete = read_retained(conn, topics.prefix, [f"{topics.prefix}/chunks/+"], timeout=30)
    assert complete
    return {topic.rsplit("/", 1)[1] for topic in found}


def test_unpublish_keeps_what_desired_state_names_and_the_chunks_other_bundles_share(
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, keys: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    v1 = demo_bundles[PROFILE]
    v2 = derive_bundle(v1, tmp_path, signing_key, TrustedKeys.load([keys[1]]), model_version="2")
    topics = Topics()
    with MosquittoBroker() as broker:
        conn = Connection(broker.url, "retention-test").start()
        try:
            m1, _ = publish_bundle(conn, topics, v1)
            m2, offer2 = publish_bundle(conn, topics, v2)
            before = _retained_chunks(conn, topics)
            assert cli(["deploy", str(v1), "--device", "d1", "--max-bytes-per-s", "40000", "--broker", broker.url,
                        "--broker-rights", "none"]) == 0  # fmt: skip

            # The desired bundle is refused, and nothing is cleared.
            assert cli(["unpublish", m1.bundle_id, "--broker", broker.url]) == 1
            assert f"{m1.bundle_id} is still named by desired state on {topics.device_desired('d1', 'default')}" in (
                capsys.readouterr().err
            )
            assert set(retained_offers(conn, topics)) == {m1.bundle_id, m2.bundle_id}

            # The other goes, with only the chunks v1 does not list (v2 differs from v1 in its manifest).
            assert cli(["unpublish", m2.bundle_id, "--broker", broker.url, "--json"]) == 0
            cleared = json.loads(capsys.readouterr().out)["chunks_cleared"]
            offers = retained_offers(conn, topics)
            assert set(offers) == {m1.bundle_id}
            kept = {ref.sha256 for ref in offers[m1.bundle_id].transfer.chunks}
            after = _retained_chunks(conn, topics)
            assert kept <= after, "every chunk of the bundle that stays is still on the broker"
            only_v2 = {ref.sha256 for ref in offer2.transfer.chunks} - kept
            assert cleared == len(only_v2) > 0 and not only_v2 & after and after == before - only_v2

            # The cap the deploy signed.
            found, _ = read_retained(conn, topics.prefix, [topics.device_desired("d1", "default")], timeout=30)
            document = json.loads(decode(SignedDesired, found[topics.device_desired("d1", "default")]).desired.payload)
            assert document["bundle_id"] == m1.bundle_id and document["max_bytes_per_s"] == 40000
        finally:
            conn.stop()
