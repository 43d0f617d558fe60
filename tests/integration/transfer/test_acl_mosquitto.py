"""TLS client certificates and the generated ACL, enforced by a real Mosquitto.

Certificates come from `edgefleet.control.credentials.pki`, the ACL from `edgefleet.control.rights.acl`; the broker has
a TLS listener with `require_certificate true` and `use_identity_as_username true`, so a certificate's CN is the user
name the ACL applies to. Fleet: `dev-a` (group g1, may download bundle b-1), `dev-b` (may download b-2).

Mosquitto drops what the ACL denies without telling an MQTT 3.1.1 client: a forbidden PUBLISH is
acknowledged and discarded, and a forbidden SUBSCRIBE is granted (2.0.11) but nothing is delivered on it.
So the negative checks below use ordering rather than sleeps: the forbidden message goes first, an allowed
one from the same client after it; once the allowed one has arrived, the forbidden one would have too.
MQTT 5 clients do hear about a forbidden PUBLISH: its PUBACK carries reason code 0x87 "Not authorized".

Tests fail, never skip, when mosquitto is missing.
"""

from __future__ import annotations

import os
import ssl
import stat
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from edgefleet.control.credentials.pki import (
    CertFiles,
    certificate_cn,
    create_ca,
    create_client_cert,
    create_server_cert,
)
from edgefleet.control.rights.acl import HOST_IDENTITY, render_acl, write_acl
from edgefleet.core.errors import BrokerError, UserInputError
from edgefleet.core.mqtt.connection import Connection, Protocol, TlsFiles, Will
from edgefleet.core.topics import Topics

from support.servers.brokers import HOST, MosquittoBroker, free_port, mqtt_handshake

WAIT = 3.0  # seconds; every wait below is bounded by this
DEVICES = {"dev-a": ["g1"], "dev-b": []}
ASSIGNMENTS = {"dev-a": ["b-1"], "dev-b": ["b-2"]}
PROTOCOLS: list[Protocol] = ["3.1.1", "5"]
TOPICS = Topics()


@dataclass(frozen=True)
class Pki:
    ca: CertFiles
    server: CertFiles
    host: CertFiles
    devices: dict[str, CertFiles]
    impostor: CertFiles  # CN dev-a, but signed by another CA


@dataclass(frozen=True)
class TlsBroker:
    broker: MosquittoBroker
    port: int
    pki: Pki

    @property
    def url(self) -> str:
        return f"mqtts://{HOST}:{self.port}"

    def tls(self, identity: str) -> TlsFiles:
        files = self.pki.host if identity == HOST_IDENTITY else self.pki.devices[identity]
        return TlsFiles(ca=str(self.pki.ca.cert), cert=str(files.cert), key=str(files.key))


class Inbox:
    """A Connection handler that keeps every message and lets a test wait for one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: list[tuple[str, bytes]] = []

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._cond:
            self.messages.append((topic, payload))
            self._cond.notify_all()

    def wait_for(self, topic: str, payload: bytes, timeout: float = WAIT) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: (topic, payload) in self.messages, timeout):
                raise AssertionError(f"{topic} {payload!r} not received within {timeout:g} s; got {self.topics()}")

    def topics(self) -> set[str]:
        with self._cond:
            return {topic for topic, _ in self.messages}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = create_ca(directory)
    other = tmp_path_factory.mktemp("other-ca")
    create_ca(other, common_name="not the edgefleet CA")
    return Pki(
        ca=ca,
        server=create_server_cert(directory, ["localhost"]),
        host=create_client_cert(directory, HOST_IDENTITY),
        devices={device: create_client_cert(directory, device) for device in DEVICES},
        impostor=create_client_cert(other, "dev-a"),
    )


@pytest.fixture(scope="module")
def tls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    acl_file = write_acl(tmp_path_factory.mktemp("acl") / "edgefleet.acl", render_acl(DEVICES, ASSIGNMENTS))
    port = free_port()
    extra = [
        f"listener {port} {HOST}",
        f"cafile {pki.ca.cert}",
        f"certfile {pki.server.cert}",
        f"keyfile {pki.server.key}",
        "require_certificate true",
        "use_identity_as_username true",
        f"acl_file {acl_file}",
    ]
    with MosquittoBroker(extra_config=extra) as broker:
        yield TlsBroker(broker, port, pki)


def _connect(
    tls_broker: TlsBroker,
    identity: str,
    protocol: Protocol,
    subscriptions: dict[str, Inbox] | None = None,
    will: Will | None = None,
) -> Connection:
    conn = Connection(
        tls_broker.url,
        f"test-{identity}-{uuid.uuid4().hex[:8]}",
        protocol=protocol,
        tls=tls_broker.tls(identity),
        will=will,
    )
    for topic, inbox in (subscriptions or {}).items():
        conn.subscribe(topic, inbox)
    try:
        return conn.start(wait=WAIT)
    except BrokerError as err:
        raise AssertionError(f"{identity} could not connect: {err}\n{tls_broker.broker.stderr()[-2000:]}") from err


def _settle(conn: Connection) -> None:
    """Return once every SUBSCRIBE this connection sent so far is in force (a message to ourselves came back)."""
    inbox, topic, nonce = Inbox(), TOPICS.events(f"sync-{uuid.uuid4().hex[:12]}"), uuid.uuid4().bytes
    conn.subscribe(topic, inbox)
    conn.publish(topic, nonce, qos=1)
    inbox.wait_for(topic, nonce)
    conn.unsubscribe(topic)


def _nonce() -> bytes:
    return uuid.uuid4().hex.encode()


# --- the files themselves


def test_credentials_files(pki: Pki) -> None:
    assert certificate_cn(pki.devices["dev-a"].cert) == "dev-a"
    assert certificate_cn(pki.host.cert) == HOST_IDENTITY
    for files in [pki.ca, pki.server, pki.host, *pki.devices.values()]:
        assert stat.S_IMODE(os.stat(files.key).st_mode) == 0o600, files.key
    with pytest.raises(UserInputError, match="refusing to overwrite"):
        create_client_cert(pki.ca.cert.parent, "dev-a")
    with pytest.raises(UserInputError, match="invalid device id"):
        create_client_cert(pki.ca.cert.parent, "dev/+")


def test_acl_lists_each_device_only_its_own_topics() -> None:
    text = render_acl(DEVICES, ASSIGNMENTS)
    blocks = {block.splitlines()[0]: block for block in text.split("\n\n") if block.startswith("user ")}
    dev_a = blocks["user dev-a"]
    assert f"topic read {TOPICS.bundle_offer('b-1')}" in dev_a
    assert f"topic read {TOPICS.group_desired_slots('g1')}" in dev_a, "every slot of its group's desired state"
    assert f"topic read {TOPICS.device_desired_slots('dev-a')}" in dev_a
    assert f"topic write {TOPICS.status('dev-a')}" in dev_a
    assert "b-2" not in dev_a and "dev-b" not in dev_a and "#" not in dev_a
    assert blocks[f"user {HOST_IDENTITY}"].endswith(f"topic readwrite {TOPICS.prefix}/#")
    assert render_acl(DEVICES, ASSIGNMENTS) == text  # deterministic
    with pytest.raises(UserInputError):
        render_acl({"dev/a": []})
    with pytest.raises(UserInputError):
        render_acl({"dev-a": ["g#"]})
    with pytest.raises(UserInputError, match="unknown devices"):
        render_acl(DEVICES, {"dev-c": ["b-1"]})


# --- enforced by Mosquitto


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_publishes_only_its_own_topics(tls_broker: TlsBroker, protocol: Protocol) -> None:
    host_inbox = Inbox()
    host = _connect(
        tls_broker,
        HOST_IDENTITY,
        "5",
        {TOPICS.all_status(): host_inbox, TOPICS.all_telemetry(): host_inbox, TOPICS.all_events(): host_inbox},
    )
    device = _connect(
        tls_broker, "dev-a", protocol, will=Will(TOPICS.status("dev-a"), b'{"online": false}')
    )  # the last will on its own status is allowed
    try:
        _settle(host)
        forged, real = _nonce(), _nonce()
        for topic in (TOPICS.status("dev-b"), TOPICS.telemetry("dev-b"), TOPICS.events("dev-b")):
            if protocol == "5":  # MQTT 5 says why: PUBACK 0x87, which Connection.publish raises
                with pytest.raises(BrokerError, match="Not authorized"):
                    device.publish(topic, forged, qos=1, retain=True, wait=WAIT)
            else:  # MQTT 3.1.1 has no way to say no: the broker acknowledges and drops it
                device.publish(topic, forged, qos=1, retain=True, wait=WAIT)
        device.publish(TOPICS.status("dev-a"), real, qos=1, retain=True, wait=WAIT)
        host_inbox.wait_for(TOPICS.status("dev-a"), real)
        assert (TOPICS.status("dev-b"), forged) not in host_inbox.messages
        assert not any("/dev-b/" in topic for topic in host_inbox.topics()), host_inbox.messages

        # Nor was the forged status retained: a new subscriber gets only what dev-a may write.
        late = Inbox()
        host.subscribe(TOPICS.status("dev-b"), late)
        host.subscribe(TOPICS.status("dev-a"), late)
        late.wait_for(TOPICS.status("dev-a"), real)
        assert late.topics() == {TOPICS.status("dev-a")}
    finally:
        device.stop()
        host.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_reads_only_its_own_and_its_groups_desired(tls_broker: TlsBroker, protocol: Protocol) -> None:
    """Every slot's document of its own and its groups' (`desired/+`), nothing of another device or group."""
    host = _connect(tls_broker, HOST_IDENTITY, "5")
    own = [TOPICS.device_desired("dev-a", "default"), TOPICS.device_desired("dev-a", "assistant")]
    retained = {
        topic: _nonce()
        for topic in (
            TOPICS.device_desired("dev-b", "default"),
            TOPICS.group_desired("g2", "default"),
            *own,
            TOPICS.group_desired("g1", "detector"),
        )
    }
    for topic, payload in retained.items():
        host.publish(topic, payload, qos=1, retain=True, wait=WAIT)
    inbox = Inbox()
    # Forbidden first: their retained messages would be queued before those of the allowed ones.
    filters = [TOPICS.device_desired_slots("dev-b"), TOPICS.group_desired_slots("g2"),
               TOPICS.device_desired_slots("dev-a"), TOPICS.group_desired_slots("g1")]  # fmt: skip
    device = _connect(tls_broker, "dev-a", protocol, dict.fromkeys(filters, inbox))
    try:
        for topic in (*own, TOPICS.group_desired("g1", "detector")):
            inbox.wait_for(topic, retained[topic])
        assert inbox.topics() == {*own, TOPICS.group_desired("g1", "detector")}

        # Live messages too: dev-b's desired published first, dev-a's after it.
        live_b, live_a = _nonce(), _nonce()
        host.publish(TOPICS.device_desired("dev-b", "default"), live_b, qos=1, retain=True, wait=WAIT)
        host.publish(TOPICS.device_desired("dev-a", "default"), live_a, qos=1, retain=True, wait=WAIT)
        inbox.wait_for(TOPICS.device_desired("dev-a", "default"), live_a)
        assert TOPICS.device_desired("dev-b", "default") not in inbox.topics()
    finally:
        device.stop()
        host.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_reads_only_assigned_bundles(tls_broker: TlsBroker, protocol: Protocol) -> None:
    host = _connect(tls_broker, HOST_IDENTITY, "5")
    block = os.urandom(128 * 1024)  # a full default-size block
    published: dict[str, bytes] = {}
    for bundle_id in ("b-2", "b-1"):
        published[TOPICS.bundle_offer(bundle_id)] = _nonce()
        published[TOPICS.bundle_block(bundle_id, 0)] = block
        published[TOPICS.bundle_block(bundle_id, 1)] = _nonce()
    for topic, payload in published.items():
        host.publish(topic, payload, qos=1, retain=True, wait=WAIT)
    inbox = Inbox()
    wanted = [TOPICS.bundle_offer("b-2"), _blocks("b-2"), TOPICS.bundle_offer("b-1"), _blocks("b-1")]
    device = _connect(tls_broker, "dev-a", protocol, dict.fromkeys(wanted, inbox))
    try:
        for topic in (TOPICS.bundle_offer("b-1"), TOPICS.bundle_block("b-1", 0), TOPICS.bundle_block("b-1", 1)):
            inbox.wait_for(topic, published[topic])
        assert not any("/b-2/" in topic for topic in inbox.topics()), inbox.topics()
    finally:
        device.stop()
        host.stop()


def test_mqtt5_reports_forbidden_publish(tls_broker: TlsBroker) -> None:
    """MQTT 5: the PUBACK of a forbidden publish says 0x87 Not authorized; an allowed one says Success."""
    tls = tls_broker.tls("dev-a")
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"test-raw-{uuid.uuid4().hex[:8]}", protocol=paho.MQTTv5
    )
    client.tls_set(ca_certs=tls.ca, certfile=tls.cert, keyfile=tls.key, tls_version=ssl.PROTOCOL_TLS_CLIENT)
    acks: dict[int, ReasonCode] = {}
    done = threading.Condition()

    def on_publish(client: paho.Client, userdata: object, mid: int, reason: ReasonCode, props: object) -> None:
        with done:
            acks[mid] = reason
            done.notify_all()

    client.on_publish = on_publish
    client.connect(HOST, tls_broker.port, keepalive=10)
    client.loop_start()
    try:
        forbidden = client.publish(TOPICS.status("dev-b"), b"forged", qos=1).mid
        allowed = client.publish(TOPICS.telemetry("dev-a"), b"{}", qos=1).mid
        with done:
            assert done.wait_for(lambda: {forbidden, allowed} <= acks.keys(), WAIT), acks
        assert acks[forbidden].value == 0x87, acks[forbidden].getName()
        assert not acks[allowed].is_failure, acks[allowed].getName()  # 0x10 "No matching subscribers" is success
    finally:
        client.disconnect()
        client.loop_stop()


def test_client_without_a_valid_certificate_cannot_connect(tls_broker: TlsBroker, pki: Pki) -> None:
    ca = str(pki.ca.cert)
    anonymous = Connection(tls_broker.url, "test-no-cert", protocol="5", tls=TlsFiles(ca=ca))
    with pytest.raises(BrokerError):
        anonymous.start(wait=1.0)
    impostor = TlsFiles(ca=ca, cert=str(pki.impostor.cert), key=str(pki.impostor.key))
    with pytest.raises(BrokerError):
        Connection(tls_broker.url, "test-impostor", protocol="5", tls=impostor).start(wait=1.0)
    with pytest.raises(OSError):  # and no plain MQTT on the TLS port
        mqtt_handshake(HOST, tls_broker.port, timeout=1.0)
    # The broker itself is fine: a device with its certificate still gets in.
    _connect(tls_broker, "dev-b", "5").stop()


def _blocks(bundle_id: str) -> str:
    """`{p}/bundles/{id}/blocks/+`, derived from the Topics builder (it has no wildcard method for it)."""
    return TOPICS.bundle_block(bundle_id, 0).rpartition("/")[0] + "/+"


def test_write_acl_is_atomic_and_readable(tmp_path: Path) -> None:
    target = tmp_path / "acl" / "edgefleet.acl"
    write_acl(target, "old\n")
    write_acl(target, render_acl(DEVICES, ASSIGNMENTS))
    assert target.read_text().startswith("# Mosquitto ACL")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["edgefleet.acl"]  # no temporary file left behind
