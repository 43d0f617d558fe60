"""Reading what a broker retains on some topic filters, and knowing when all of it has arrived.

A broker sends the retained messages matching a subscription before anything published after that subscription,
so a marker this connection publishes to itself once it has subscribed arrives after the last retained message.
Used by the retained janitor, by chunk publishing (the offers on the broker are the record of what was
published) and by bundle retention (which bundles desired state still names).
"""

from __future__ import annotations

import threading
import uuid

from edgefleet.core.mqtt import Connection


def read_retained(conn: Connection, prefix: str, filters: list[str], timeout: float) -> tuple[dict[str, bytes], bool]:
    """(topic -> retained payload, every retained message arrived before `timeout`). Empty payloads are skipped."""
    found: dict[str, bytes] = {}
    lock, done = threading.Lock(), threading.Event()
    marker = f"{prefix}/reader/{uuid.uuid4().hex}"

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        if retained and payload:
            with lock:
                found[topic] = payload

    for topic_filter in filters:
        conn.subscribe(topic_filter, on_message)
    conn.subscribe(marker, lambda *_: done.set())
    try:
        conn.publish(marker, b"read", qos=1)
        complete = done.wait(timeout)
    finally:
        for topic_filter in [*filters, marker]:
            conn.unsubscribe(topic_filter)
    with lock:
        return dict(found), complete


__all__ = ["read_retained"]
