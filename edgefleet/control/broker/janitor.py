"""Clear retained messages that devices leave where only their status may be retained.

A device may write its own `telemetry`, `events` and `infer/response/+` topics, and nothing in Mosquitto 2.0.11
can say "but not retained": `acl_file` has no notion of it, and the dynamic-security plugin's ACL types
(publishClientSend/Receive, subscribe/unsubscribe Literal/Pattern) ignore the retain flag (plugins/dynamic-security
never reads `mosquitto_evt_acl_check.retain`). `retain_available false` would switch retained messages off for
everyone, and edgefleet's bundles, offers, desired state and status are retained by design.

So the control plane sweeps: every `sweep()` subscribes to those topics of every device, takes the retained
messages the broker delivers on subscribing (they arrive before a marker this connection publishes after the
SUBSCRIBE), unsubscribes, and publishes an empty retained message on each topic, which deletes it. A device can
hold at most what it wrote since the last sweep; other devices' topics it cannot write at all (broker rights).
"""

from __future__ import annotations

import logging

from edgefleet.control.broker.retained import read_retained
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

SWEEP_TIMEOUT_S = 10.0


class RetainedJanitor:
    def __init__(self, conn: Connection, topics: Topics) -> None:
        self.conn, self.topics = conn, topics
        self.cleared_total = 0

    def filters(self) -> list[str]:
        """Device topics where nothing may stay retained (status is the one retained device topic)."""
        p = self.topics.prefix
        return [f"{p}/devices/+/telemetry", f"{p}/devices/+/events", f"{p}/devices/+/infer/response/+"]

    def sweep(self, timeout: float = SWEEP_TIMEOUT_S) -> list[str]:
        """Delete every retained message on the `filters()` topics; returns the topics cleared."""
        found, complete = read_retained(self.conn, self.topics.prefix, self.filters(), timeout)
        if not complete:
            log.warning("retained sweep: no marker within %g s; clearing what arrived", timeout)
        cleared = sorted(found)
        for topic in cleared:
            self.conn.publish(topic, b"", qos=1, retain=True, wait=timeout)
        if cleared:
            self.cleared_total += len(cleared)
            log.warning("cleared %d retained message(s) devices left on %s", len(cleared), ", ".join(cleared[:5]))
        return cleared


__all__ = ["RetainedJanitor"]
