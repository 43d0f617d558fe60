"""How streamed text leaves the device: the first piece at once, then pieces joined for at most an interval.

A small model decodes a token in about 0.1 ms; an event (or an MQTT chunk) per token costs the device its JSON, a
send and a client wake-up per token, which measured 0.06 ms a token on the local API (bench/generate.py): more than
half of the model's own time. Joining what arrives within `interval_s` bounds that cost by the interval, not the
token rate, and delays no text by more than the interval plus one token's time: the first piece (the time to first
token) and every piece of a model slower than the interval go out as they come. Pure: the clock is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Send = Callable[[str], bool]  # sends joined text; False once the receiver is gone


class Coalescer:
    def __init__(self, interval_s: float, send: Send, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self._send, self._clock = interval_s, send, clock
        self._pending: list[str] = []
        self._sent_at = float("-inf")
        self.alive = True
        self.sends = 0

    def text(self, piece: str) -> bool:
        """Take one decoded piece; send what waits when the interval since the last send has passed."""
        self._pending.append(piece)
        now = self._clock()
        if now - self._sent_at >= self.interval_s:
            self._flush(now)
        return self.alive

    def flush(self) -> bool:
        """Send what waits (before the answer's last event)."""
        if self._pending:
            self._flush(self._clock())
        return self.alive

    def take(self) -> str:
        """What waits, handed over instead of sent (for a last message that carries it)."""
        text, self._pending = "".join(self._pending), []
        return text

    def _flush(self, now: float) -> None:
        text = self.take()
        self._sent_at = now
        self.sends += 1
        if self.alive and not self._send(text):
            self.alive = False


__all__ = ["Coalescer"]
