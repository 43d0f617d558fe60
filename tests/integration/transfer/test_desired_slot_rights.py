"""Broker rights on per-slot desired state, against the SHIPPED secure Mosquitto (mutual TLS, dynamic security):
a device's role made before slots granted only the single-model topic `devices/{id}/desired`; the control plane's
next rights sync replaces it with `devices/{id}/desired/+`, so the device reads every slot's document of its own
again (and still nothing of another device's)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from edgefleet.control.rights.dynsec import Acl, device_role
from edgefleet.control.rights.sync import DeviceGrant, open_rights
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki

WAIT = 10.0
TOPICS = Topics()
DEVICE, OTHER = "dev-upgraded", "dev-other"


class Inbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: dict[str, bytes] = {}

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._cond:
            self.messages[topic] = payload
            self._cond.notify_all()

    def wait_for(self, topic: str, payload: bytes) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.messages.get(topic) == payload, WAIT):
                raise AssertionError(f"{topic} not received within {WAIT:g} s: {sorted(self.messages)}")


def test_a_role_from_before_slots_is_given_every_slot_of_its_own_desired_state(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", [DEVICE, OTHER], hosts=(HOST_IDENTITY, CLI_IDENTITY))
    with SecureBroker(pki, {DEVICE: [], OTHER: []}, host_users=(HOST_IDENTITY, CLI_IDENTITY)) as broker:
        host = broker.connect(HOST_IDENTITY)
        try:
            rights = open_rights(host, TOPICS, "dynsec")
            role, slots = device_role(DEVICE), TOPICS.device_desired_slots(DEVICE)
            legacy = TOPICS.legacy_device_desired(DEVICE)
            rights.client.check([  # the role as `keys dynsec` wrote it before slots
                {"command": "removeRoleACL", "rolename": role, "acltype": "subscribePattern", "topic": slots},
                {"command": "removeRoleACL", "rolename": role, "acltype": "publishClientReceive", "topic": slots},
                {"command": "addRoleACL", "rolename": role, **Acl("subscribeLiteral", legacy).to_json()},
                {"command": "addRoleACL", "rolename": role, **Acl("publishClientReceive", legacy).to_json()},
            ])  # fmt: skip
            change = rights.follow({d: DeviceGrant(d, frozenset(), frozenset()) for d in (DEVICE, OTHER)})
            assert change.granted == {DEVICE: 2} and change.revoked == {DEVICE: 2}, "the literal gives way to /+"
            assert rights.follow({d: DeviceGrant(d, frozenset(), frozenset()) for d in (DEVICE, OTHER)}).granted == {}

            documents = {
                TOPICS.device_desired(DEVICE, "default"): uuid.uuid4().bytes,
                TOPICS.device_desired(DEVICE, "assistant"): uuid.uuid4().bytes,
                TOPICS.device_desired(OTHER, "default"): uuid.uuid4().bytes,
            }
            for topic, payload in documents.items():
                host.publish(topic, payload, qos=1, retain=True, wait=WAIT)
            device = broker.connect(DEVICE)
            inbox = Inbox()
            try:
                device.subscribe(TOPICS.device_desired_slots(OTHER), inbox)  # refused: another device's
                device.subscribe(slots, inbox)
                for topic in (TOPICS.device_desired(DEVICE, "default"), TOPICS.device_desired(DEVICE, "assistant")):
                    inbox.wait_for(topic, documents[topic])
                assert TOPICS.device_desired(OTHER, "default") not in inbox.messages
            finally:
                device.stop()
        finally:
            host.stop()
