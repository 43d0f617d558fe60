"""Reading what a broker retains on some topic filters, and knowing when all of it has arrived.

A broker sends the retained messages matching a subscription before anything published after that subscription,
so a marker this connection publishes to itself once it has subscribed arrives after the last retained message.
Used by the retained janitor, by chunk publishing (the offers on the broker are the record of what was
published) and by bundle retention (which bundles desired state still names).
"""

from __future__ import annotations

import threading
import time
import uuid

from edgefleet.core.mqtt.connection import Connection


def read_retained(conn: Connection, prefix: str, filters: list[str], timeout: float) -> tuple[dict[str, bytes], bool]:
    """(topic -> retained payload, every retained message arrived before `timeout`). Empty payloads are skipped.

    The filters and the marker go in one SUBSCRIBE, and the marker is published only once the broker acknowledged
    it: amqtt takes one SUBSCRIBE per turn of its session loop while it routes PUBLISHes in between, so a marker
    sent right behind several SUBSCRIBEs could be routed before its own subscription existed, and was lost."""
    found: dict[str, bytes] = {}
    lock, done = threading.Lock(), threading.Event()
    marker = f"{prefix}/reader/{uuid.uuid4().hex}"
    started = time.monotonic()

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        if topic == marker:
            done.set()
        elif retained and payload:
            with lock:
                found[topic] = payload

    try:
        complete = conn.subscribe_many([*filters, marker], on_message, wait=timeout)
        if complete:
            conn.publish(marker, b"read", qos=1)
            complete = done.wait(max(0.0, timeout - (time.monotonic() - started)))
    finally:
        conn.unsubscribe_many([*filters, marker])
    with lock:
        return dict(found), complete


__all__ = ["read_retained"]
