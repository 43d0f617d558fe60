"""What edgefleet needs from an MQTT broker, checked on both: the embedded amqtt one and a real Mosquitto.

Bundles travel as retained binary blocks of up to 128 KiB with QoS 1; device presence relies on last wills.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgefleet.control.broker.embedded import EmbeddedBroker

from support.servers.brokers import MosquittoBroker, free_port

HOST = "127.0.0.1"
WAIT = 2.0  # seconds; every wait below is bounded by this


class Broker(Protocol):
    @property
    def port(self) -> int: ...

    @property
    def url(self) -> str: ...


@pytest.fixture(scope="module")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="module")
def mosquitto_broker() -> Iterator[MosquittoBroker]:
    with MosquittoBroker() as broker:
        yield broker


@pytest.fixture(params=["embedded", "mosquitto"])
def broker(request: pytest.FixtureRequest) -> Broker:
    fixture: Broker = request.getfixturevalue(f"{request.param}_broker")
    return fixture


@dataclass
class Session:
    """A paho client and what its callbacks saw."""

    client: mqtt.Client
    connected: threading.Event = field(default_factory=threading.Event)
    connack: list[ReasonCode] = field(default_factory=list)
    disconnects: list[ReasonCode] = field(default_factory=list)
    messages: queue.Queue[mqtt.MQTTMessage] = field(default_factory=queue.Queue)

    def next_message(self) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no message within {WAIT} s") from None

    def subscribe(self, topic: str, qos: int = 1) -> None:
        granted = threading.Event()
        self.client.on_subscribe = lambda *_: granted.set()
        result, _ = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        assert granted.wait(WAIT), f"no SUBACK for {topic!r}"

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(WAIT)  # for QoS 1: until the PUBACK arrives
        assert info.is_published(), f"no PUBACK for {topic!r}"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def new_client(protocol: MQTTProtocolVersion = mqtt.MQTTv311) -> Session:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:12]}", protocol=protocol)
    session = Session(client)

    def on_connect(_c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        session.connack.append(reason)
        session.connected.set()

    def on_disconnect(_c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        session.disconnects.append(reason)

    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    client.on_message = lambda _c, _u, message: session.messages.put(message)
    return session


def connect(broker: Broker, protocol: MQTTProtocolVersion = mqtt.MQTTv311, **will: Any) -> Session:
    """A connected client; `will` is passed to `will_set(topic=..., payload=..., qos=...)`."""
    session = new_client(protocol)
    if will:
        session.client.will_set(**will)
    session.client.connect(HOST, broker.port, keepalive=10)
    session.client.loop_start()
    assert session.connected.wait(WAIT), "no CONNACK"
    assert not session.connack[0].is_failure, f"refused: {session.connack[0]}"
    return session


def pump(session: Session, until: Callable[[], bool], seconds: float) -> float:
    """Run paho's loop in this thread until `until()` or `seconds` pass; the seconds it took."""
    started = time.monotonic()
    while not until() and time.monotonic() - started < seconds:
        session.client.loop(timeout=0.01)
    return time.monotonic() - started


def unique_topic(name: str) -> str:
    return f"edgefleet/test/{name}/{uuid.uuid4().hex[:8]}"


def test_a_retained_160_kib_binary_payload_reaches_a_later_subscriber_byte_identical(broker: Broker) -> None:
    topic = unique_topic("bundle")
    payload = os.urandom(160 * 1024)  # bigger than the biggest bundle block (128 KiB), every byte value

    publisher = connect(broker)
    publisher.publish(topic, payload, qos=1, retain=True)
    publisher.close()

    subscriber = connect(broker)
    try:
        subscriber.subscribe(topic, qos=1)
        message = subscriber.next_message()
        assert message.topic == topic
        assert message.retain, "a message sent because of a new subscription carries the retain flag"
        assert message.qos == 1
        assert message.payload == payload
        subscriber.publish(topic, b"", qos=1, retain=True)  # an empty retained message deletes it
    finally:
        subscriber.close()


def test_the_last_will_is_published_when_a_client_dies_without_disconnect(broker: Broker) -> None:
    topic = unique_topic("will")
    watcher = connect(broker)
    try:
        watcher.subscribe(topic, qos=1)
        dying = new_client()
        dying.client.will_set(topic, b"offline", qos=1)
        dying.client.connect(HOST, broker.port, keepalive=10)
        pump(dying, dying.connected.is_set, WAIT)
        assert dying.connack and dying.connack[0].value == 0
        sock = dying.client.socket()
        assert isinstance(sock, socket.socket)
        sock.close()  # the process died: the socket closes, no DISCONNECT is sent

        message = watcher.next_message()
        assert (message.topic, message.payload, message.qos) == (topic, b"offline", 1)
    finally:
        watcher.close()


def test_a_clean_disconnect_does_not_publish_the_last_will(broker: Broker) -> None:
    topic = unique_topic("will")
    watcher = connect(broker)
    try:
        watcher.subscribe(topic, qos=1)
        leaving = connect(broker, topic=topic, payload=b"offline", qos=1)
        leaving.close()
        watcher.publish(topic, b"marker", qos=1)
        assert watcher.next_message().payload == b"marker"
    finally:
        watcher.close()


def test_the_embedded_broker_refuses_a_bare_mqtt5_connect_at_once(embedded_broker: EmbeddedBroker) -> None:
    """amqtt speaks MQTT 3.1.1 only. A v5 CONNECT without properties, will or credentials gets, within
    milliseconds, a CONNACK with the 3.1.1 code 1; paho reports it to on_connect as reason 132 "Unsupported
    protocol version", then calls on_disconnect with reason 128 "Unspecified error" (the socket is closed).
    A client can then connect again with MQTT 3.1.1."""
    probe = new_client(mqtt.MQTTv5)
    probe.client.connect(HOST, embedded_broker.port, keepalive=10)
    elapsed = pump(probe, lambda: bool(probe.disconnects), WAIT)

    assert [(r.value, r.getName(), r.is_failure) for r in probe.connack] == [
        (132, "Unsupported protocol version", True)
    ]
    assert [(r.value, r.getName()) for r in probe.disconnects] == [(128, "Unspecified error")]
    assert elapsed < 0.5
    assert probe.client.loop(timeout=0.01) == mqtt.MQTT_ERR_NO_CONN

    fallback = connect(embedded_broker, mqtt.MQTTv311)
    assert fallback.connack[0].value == 0
    fallback.close()


def test_the_embedded_broker_never_answers_an_mqtt5_connect_with_properties(
    embedded_broker: EmbeddedBroker,
) -> None:
    """A v5 CONNECT with properties (or a will, or a username) is misparsed by amqtt as 3.1.1: it waits
    for bytes that never come and sends no CONNACK. paho gives up after `keepalive` seconds, with no
    on_connect and on_disconnect reason 141 "Keep alive timeout": protocol probing must send a bare
    CONNECT, or bound its wait for the CONNACK."""
    probe = new_client(mqtt.MQTTv5)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 60
    probe.client.connect(HOST, embedded_broker.port, keepalive=1, properties=properties)
    elapsed = pump(probe, lambda: bool(probe.connack or probe.disconnects), 2 * WAIT)

    assert probe.connack == [], "amqtt answered a v5 CONNECT with properties"
    assert [(r.value, r.getName()) for r in probe.disconnects] == [(141, "Keep alive timeout")]
    assert 0.9 < elapsed < 1.5


def test_mqtt5_works_on_mosquitto(mosquitto_broker: MosquittoBroker) -> None:
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 60
    session = new_client(mqtt.MQTTv5)
    session.client.connect(HOST, mosquitto_broker.port, keepalive=10, properties=properties)
    session.client.loop_start()
    try:
        assert session.connected.wait(WAIT)
        assert session.connack[0].value == 0
        topic = unique_topic("v5")
        session.subscribe(topic, qos=1)
        session.publish(topic, b"\x00\xffv5", qos=1)
        message = session.next_message()
        assert (message.payload, message.qos) == (b"\x00\xffv5", 1)
    finally:
        session.close()


def test_the_embedded_broker_picks_a_free_port_stops_cleanly_and_forgets_retained_messages() -> None:
    broker = EmbeddedBroker()
    with broker:
        assert broker.port > 0
        assert broker.url == f"mqtt://127.0.0.1:{broker.port}"
        publisher = connect(broker)
        publisher.publish("edgefleet/test/forgotten", b"x", qos=1, retain=True)
        publisher.close()
    broker.stop()  # a second stop is harmless
    with pytest.raises(OSError):
        socket.create_connection((HOST, broker.port), timeout=0.5).close()

    port = broker.port
    with broker:  # started again: the same port, a fresh amqtt; retained messages lived in memory only
        assert broker.port == port
        subscriber = connect(broker)
        subscriber.subscribe("edgefleet/test/forgotten")
        with pytest.raises(queue.Empty):
            subscriber.messages.get(timeout=0.3)
        subscriber.close()


def test_the_embedded_broker_reports_a_busy_port_as_a_runtime_error() -> None:
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        broker = EmbeddedBroker(port=busy.getsockname()[1])
        with pytest.raises(RuntimeError, match="could not listen") as caught:
            broker.start(timeout=5)
        assert caught.value.__cause__ is not None


def test_mosquitto_restarts_on_the_same_port_and_keeps_retained_messages_when_persistent(
    tmp_path: Path,
) -> None:
    port = free_port()
    with MosquittoBroker(port=port, persistence_dir=tmp_path / "db") as broker:
        publisher = connect(broker)
        publisher.publish("edgefleet/test/kept", b"kept", qos=1, retain=True)
        publisher.close()
        broker.restart()
        assert broker.port == port
        subscriber = connect(broker)
        subscriber.subscribe("edgefleet/test/kept")
        assert subscriber.next_message().payload == b"kept"
        subscriber.close()
