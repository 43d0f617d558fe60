"""Broker rights on content-addressed chunks, against the SHIPPED secure Mosquitto (mutual TLS, dynamic security).

Chunks are shared by bundles, so a device reads a chunk by its name (the sha256 of its bytes, which only signed
offers list): it may subscribe to one chunk topic, never to all of them at once, and never write one.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator

import pytest

from edgefleet.control.rights.acl import render_acl
from edgefleet.control.rights.sync import DeviceGrant, open_rights
from edgefleet.core.errors import BrokerError
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.attacks.ledger import AttackLedger
from support.servers.secure_broker import CLI_IDENTITY, Pki, SecureBroker, make_pki

WAIT = 10.0
TOPICS = Topics()
DEVICES = {"dev-chunky": ["lab"]}


class Inbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: list[tuple[str, bytes]] = []

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._cond:
            self.messages.append((topic, payload))
            self._cond.notify_all()

    def wait_for(self, topic: str, payload: bytes) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: (topic, payload) in self.messages, WAIT):
                raise AssertionError(f"{topic} not received within {WAIT:g} s")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    pki: Pki = make_pki(tmp_path_factory.mktemp("pki"), list(DEVICES), hosts=(HOST_IDENTITY, CLI_IDENTITY))
    with SecureBroker(pki, DEVICES, host_users=(HOST_IDENTITY, CLI_IDENTITY)) as running:
        yield running


def _chunk() -> tuple[str, bytes]:
    data = uuid.uuid4().hex.encode() * 64
    return TOPICS.chunk(hashlib.sha256(data).hexdigest()), data


def test_a_device_reads_a_chunk_by_name_but_never_every_chunk_and_never_writes_one(
    broker: SecureBroker, attack_ledger: AttackLedger
) -> None:
    host = broker.connect(HOST_IDENTITY)
    rights = open_rights(host, TOPICS, "dynsec")  # a bundle deployed to the device brings chunk rights with it
    rights.follow({"dev-chunky": DeviceGrant("dev-chunky", frozenset({"lab"}), frozenset({"b-chunky"}))})
    secret_topic, secret = _chunk()  # a chunk of a bundle this device is not deployed: it cannot know its name
    named_topic, named = _chunk()  # a chunk of an offer it may read
    host.publish(secret_topic, secret, qos=1, retain=True, wait=WAIT)
    host.publish(named_topic, named, qos=1, retain=True, wait=WAIT)
    device = broker.connect("dev-chunky")
    inbox = Inbox()
    try:
        for wildcard in (TOPICS.all_chunks(), TOPICS.all_chunks()[:-1] + "#", f"{TOPICS.prefix}/#", "#"):
            device.subscribe(wildcard, inbox)
        device.subscribe(named_topic, inbox)  # subscriptions are handled in order: once this arrives, so would they
        inbox.wait_for(named_topic, named)
        leaked = [topic for topic, _ in inbox.messages if topic != named_topic]
        assert not attack_ledger.record(
            "a device certificate subscribing to every chunk (chunks/+, chunks/#, prefix/#, #)",
            bool(leaked),
            f"the chunk it named arrived; through the wildcards: {leaked or 'nothing'}",
        )
        forged_topic, forged = _chunk()
        with pytest.raises(BrokerError, match="Not authorized"):
            device.publish(forged_topic, forged, qos=1, retain=True, wait=WAIT)
        with pytest.raises(BrokerError, match="Not authorized"):
            device.publish(named_topic, b"\x00" * len(named), qos=1, retain=True, wait=WAIT)
        check = Inbox()
        host.subscribe(named_topic, check)
        check.wait_for(named_topic, named)  # the retained chunk is still the host's
        attack_ledger.record("a device certificate writing a chunk", False, "PUBACK Not authorized; chunk unchanged")
    finally:
        device.stop()
        host.stop()


def test_an_acl_file_lists_the_chunks_of_assigned_bundles_by_name_and_no_wildcard() -> None:
    """Mosquitto's acl_file allows a wildcard subscription wherever it allows the topics it covers, so chunk rights
    there are literal topics, one per chunk of each assigned bundle."""
    names = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(3)]
    text = render_acl(
        {"dev-a": [], "dev-b": []}, {"dev-a": ["b-1"], "dev-b": ["b-2"]}, chunks={"b-1": names[:2], "b-2": [names[2]]}
    )
    dev_a = next(block for block in text.split("\n\n") if block.startswith("user dev-a"))
    assert [line for line in dev_a.splitlines() if "/chunks/" in line] == [
        f"topic read {TOPICS.chunk(sha)}" for sha in sorted(names[:2])
    ]
    assert "+" not in "".join(line for line in dev_a.splitlines() if "/chunks/" in line)
