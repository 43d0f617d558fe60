"""A retained last value (a device's status) stays the newest one across a reconnect, on a real Mosquitto.

paho re-sends what the broker had not acknowledged when a connection dropped, after the `on_connect` callback
has run, so a client that refreshes its status on connect would have the broker apply the new value and then
the old, replayed one. `Connection.publish_latest` publishes the newest once more when that happens
(edgefleet/core/mqtt/last_value.py). The scenario is the one CI met: an agent kicked right after publishing
"installing" committed its bundle while away, and the control plane kept "installing" until the rollout timed out.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from edgefleet.core.mqtt.connection import Connection

from support.servers.brokers import MosquittoBroker

TOPIC = "edgefleet/v1/devices/dev-replay/status"


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.02)


def _retained(broker: MosquittoBroker) -> bytes:
    inbox: queue.Queue[bytes] = queue.Queue()
    reader = Connection(broker.url, "status-reader").start()
    try:
        reader.subscribe(TOPIC, lambda _t, payload, _r: inbox.put(payload))
        return inbox.get(timeout=10)
    finally:
        reader.stop()


def test_a_status_replayed_after_a_reconnect_does_not_replace_the_newer_one() -> None:
    state = {"now": b"serving v1"}
    with MosquittoBroker() as broker:
        device = Connection(broker.url, "dev-replay", on_connected=lambda: device.publish_latest(TOPIC, state["now"]))
        device.start()
        try:
            _wait("the first status", device.last_values.settled)
            broker.pause()  # the broker takes the next status but never applies or acknowledges it
            state["now"] = b"installing v2"
            replayed = device.publish_latest(TOPIC, state["now"])
            broker.kill()  # the connection drops with "installing" unacknowledged: paho will send it again
            _wait("the disconnect", lambda: not device.connected)
            state["now"] = b"serving v2"  # committed while away; the status is refreshed on connect
            broker.start()
            _wait("the reconnect", lambda: device.connected)
            _wait("the replay of the old status", replayed.is_published)
            _wait("every status acknowledged", device.last_values.settled)
            assert _retained(broker) == b"serving v2"
            assert device.last_values.replays_superseded >= 1
        finally:
            device.stop()


def test_values_acknowledged_in_order_are_published_once() -> None:
    with MosquittoBroker() as broker:
        device = Connection(broker.url, "dev-in-order").start()
        try:
            for value in (b"idle", b"downloading", b"installing", b"serving"):
                device.publish_latest(TOPIC, value, wait=10)
            assert device.last_values.replays_superseded == 0
            assert _retained(broker) == b"serving"
        finally:
            device.stop()
