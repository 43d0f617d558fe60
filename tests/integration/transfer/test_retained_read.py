"""Reading what a broker retains, and knowing all of it arrived: on Mosquitto and on the embedded broker (amqtt),
which routes a PUBLISH while it still has SUBSCRIBEs that came ahead of it to take in. `edgefleet demo` on the
embedded broker failed on that: "could not read the retained offers within 10 s"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgefleet.control.broker.embedded import EmbeddedBroker
from edgefleet.control.broker.retained import read_retained
from edgefleet.core.mqtt.connection import Connection

FILTERS = [f"rr/{kind}/+/doc" for kind in ("offers", "desired", "pages", "keys", "status")]


@pytest.fixture(params=["mosquitto", "embedded"])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "mosquitto":  # the session's real Mosquitto (conftest.py)
        yield request.getfixturevalue("mosquitto").url
        return
    with EmbeddedBroker() as broker:
        yield broker.url


def test_every_retained_message_on_several_filters_is_read_every_time(broker_url: str) -> None:
    writer = Connection(broker_url, "rr-writer").start()
    reader = Connection(broker_url, "rr-reader").start()
    try:
        expected = {}
        for index, pattern in enumerate(FILTERS):
            for item in range(3):
                topic = pattern.replace("+", f"item{item}")
                expected[topic] = f"{index}-{item}".encode()
                writer.publish(topic, expected[topic], retain=True, wait=10)
        for attempt in range(30):  # each read is five SUBSCRIBEs' worth of filters, then the marker
            found, complete = read_retained(reader, "rr", FILTERS, timeout=10)
            assert complete, f"read {attempt}: the marker never came back"
            assert found == expected, f"read {attempt}"
    finally:
        reader.stop()
        writer.stop()


def test_a_subscription_can_wait_for_the_brokers_acknowledgement(broker_url: str) -> None:
    conn = Connection(broker_url, "rr-suback").start()
    try:
        assert conn.subscribe_many(["rr/a", "rr/b/+"], lambda *_: None, wait=10)
    finally:
        conn.stop()
    unstarted = Connection(broker_url, "rr-unstarted")
    assert not unstarted.subscribe_many(["rr/a"], lambda *_: None, wait=1), "no connection: no acknowledgement"
