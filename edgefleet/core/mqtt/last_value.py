"""Retained last values (a device's status) that a replay after a reconnect cannot leave stale.

paho re-sends every QoS 1 message the broker had not acknowledged when a connection dropped, but only after the
`on_connect` callback has run. A client that refreshes its retained status in `on_connect` (as it should: what it
published while away was skipped) therefore has the broker receive the new value first and the old, replayed one
after it, and the old one is what stays retained. Seen in CI: an agent kicked by the broker right after it
published "installing" committed its bundle while away, published "serving" on reconnect, and the control plane
kept "installing" (the replay) until the rollout timed out.

`LastValues` keeps, per topic, the newest publish and the older ones still unacknowledged, for as long as any of
them is unacknowledged. The broker acknowledges one connection's messages in the order it applied them, so an
older value acknowledged after the newest one was applied after it: the newest is then published once more.
Nothing here calls paho while holding its own lock (paho calls `on_publish` holding its outgoing-message lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as paho

_MAX_OLDER = 64


@dataclass
class _Topic:
    payload: bytes
    qos: int
    newest: paho.MQTTMessageInfo
    older: list[paho.MQTTMessageInfo] = field(default_factory=list)  # not yet acknowledged


class LastValues:
    """The retained last values one connection publishes; `republish(topic, payload, qos)` sends one again.

    Whether a value was acknowledged is paho's own `is_published()`, read when it matters, never copied: paho sets
    it just after `on_publish` returns, and a caller's `published` may run in between."""

    def __init__(self, republish: Callable[[str, bytes, int], object]) -> None:
        self._republish = republish
        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self._by_mid: dict[int, str] = {}  # the publishes of each topic whose PUBACK has not been seen here
        self.replays_superseded = 0  # how often a replayed old value was followed by the newest again

    def published(self, topic: str, payload: bytes, qos: int, info: paho.MQTTMessageInfo) -> None:
        """`info` is the newest value of `topic` (called right after paho took it; its PUBACK may be in already)."""
        with self._lock:
            state = self._topics.get(topic)
            earlier = [] if state is None else [*state.older, state.newest]
            older = [m for m in earlier if not m.is_published()][-_MAX_OLDER:]  # the bound only limits memory
            for gone in {m.mid for m in earlier} - {m.mid for m in older}:
                self._by_mid.pop(gone, None)
            if info.is_published() and not older:  # nothing can be replayed over it: nothing to keep
                self._topics.pop(topic, None)
                return
            self._topics[topic] = _Topic(payload, qos, info, older)
            if not info.is_published():  # else its PUBACK was seen already (paid no attention: not yet recorded)
                self._by_mid[info.mid] = topic

    def settled(self) -> bool:
        """Whether every value published here has been acknowledged."""
        with self._lock:
            return all(m.is_published() for t in self._topics.values() for m in (t.newest, *t.older))

    def held(self) -> int:
        """How many topics are held: those with a value in flight."""
        with self._lock:
            return len(self._topics)

    def acknowledged(self, mid: int) -> None:
        """The broker acknowledged `mid` (the network thread, before paho marks it published)."""
        with self._lock:
            topic = self._by_mid.pop(mid, None)
            state = self._topics.get(topic) if topic is not None else None
            if topic is None or state is None:
                return
            if state.newest.mid == mid:  # the newest applied: whatever older one comes after it matters
                if not state.older:
                    del self._topics[topic]
                return
            state.older = [m for m in state.older if m.mid != mid]
            if not state.newest.is_published():  # applied before the newest: nothing to do
                return
            if not state.older:
                del self._topics[topic]  # only values still in flight are kept (a fleet has many topics)
            self.replays_superseded += 1  # applied after the newest: the broker now holds an old value
            again = (topic, state.payload, state.qos)
        self._republish(*again)


__all__ = ["LastValues"]
