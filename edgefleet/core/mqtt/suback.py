"""Waiting for a broker's SUBACK, by packet id (edgefleet.core.mqtt's `subscribe_many(..., wait=)`).

A SUBACK may beat its waiter: the network thread can read it before `subscribe` returned the packet id to the
caller. Such an early SUBACK is kept for a while, then forgotten. A lost connection abandons every wait: the
SUBACK of a SUBSCRIBE sent on it will never come, and the caller subscribes again once it is back.
"""

from __future__ import annotations

import threading
import time


class SubackWaiters:
    EARLY_KEEP_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, threading.Event] = {}
        self._acknowledged: set[int] = set()  # waited-for ids whose SUBACK came
        self._early: dict[int, float] = {}  # id -> when its SUBACK came with nobody waiting

    def acknowledged(self, mid: int) -> None:
        """The network thread read the SUBACK of packet `mid`."""
        now = time.monotonic()
        with self._lock:
            event = self._waiting.get(mid)
            if event is not None:
                self._acknowledged.add(mid)
                event.set()
                return
            self._early = {m: t for m, t in self._early.items() if now - t < self.EARLY_KEEP_S}
            self._early[mid] = now

    def abandon(self) -> None:
        """The connection is gone: every wait ends, unacknowledged."""
        with self._lock:
            for event in self._waiting.values():
                event.set()
            self._early.clear()

    def wait(self, mid: int, timeout: float) -> bool:
        """Whether the SUBACK of packet `mid` came within `timeout` (False when the connection was lost first)."""
        with self._lock:
            if self._early.pop(mid, None) is not None:
                return True
            event = self._waiting[mid] = threading.Event()
        event.wait(max(0.0, timeout))
        with self._lock:
            self._waiting.pop(mid, None)
            acknowledged = mid in self._acknowledged
            self._acknowledged.discard(mid)
        return acknowledged


__all__ = ["SubackWaiters"]
