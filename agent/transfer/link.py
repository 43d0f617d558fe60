"""The device's link: a byte-rate cap for paid links, reports before bundle chunks, a window sized by round trips.

One `LinkPacer` per agent. Two kinds of traffic share it:
- reports (telemetry, events, status, answers): every publish on the agent's connection. They never wait; their
  bytes are debited from the cap's bucket when queued, and while one is not yet acknowledged by the broker the
  download asks for nothing new (it yields its budget), so a report is never stuck behind bundle bytes;
- bulk (bundle blocks/chunks): the downloader asks `acquire_bulk(n)` before it requests n bytes. That waits until
  the token bucket holds n bytes and no report is pending, which is what holds the achieved rate to the cap: bytes
  are charged when requested, so in-flight bytes never run ahead of the budget.

The cap is the smaller of the agent's configuration and the signed desired state (`Desired.max_bytes_per_s`);
either may be unset. `RttWindow` sizes the number of requests in flight from the measured round trip and delivery
rate (twice the bandwidth-delay product, in blocks), so a satellite link keeps its pipe full and a loopback or
capped link does not queue more than it needs.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.core.messages import Desired, LinkReport

URGENT_MAX_WAIT_S = 2.0  # a report the broker never acknowledges (a lost connection) stops holding bulk back
BURST_S = 0.25  # the bucket holds at most this many seconds of the cap (and at least one request)
RTT_ALPHA = 1 / 8  # smoothing of the round-trip estimate (RFC 6298)


def effective_cap(*caps: int | None) -> int | None:
    """The smallest cap that is set (None: no cap)."""
    chosen = [c for c in caps if c is not None and c > 0]
    return min(chosen) if chosen else None


class TokenBucket:
    """Bytes allowed at `rate` per second, at most `burst` ahead; a debit may drive it below zero (reports)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.rate: float | None = None
        self.tokens = 0.0
        self._last = clock()
        self.set_rate(rate)

    def set_rate(self, rate: float | None) -> None:
        self._refill()
        self.rate = float(rate) if rate else None
        self.tokens = min(self.tokens, self.burst(0))

    def burst(self, request: int) -> float:
        return max(float(request), (self.rate or 0.0) * BURST_S)

    def _refill(self) -> None:
        now = self._clock()
        if self.rate is not None:
            self.tokens += (now - self._last) * self.rate
        self._last = now

    def delay(self, request: int) -> float:
        """Seconds until `request` bytes fit (0: now). Does not debit."""
        if self.rate is None:
            return 0.0
        self._refill()
        self.tokens = min(self.tokens, self.burst(request))
        short = request - self.tokens
        return 0.0 if short < 1.0 else short / self.rate  # within a byte: now (float rounding never stalls)

    def debit(self, amount: int) -> None:
        self._refill()
        if self.rate is not None:
            self.tokens -= amount


class RttWindow:
    """Requests in flight = 2 x bandwidth-delay product (in blocks) + 2, within bounds.

    Round trip: from a request to its block's arrival; its minimum is the base delay (what is left when no queue
    builds; the smoothed one grows with the window itself, so it must not size it). Delivery rate: bytes arrived
    per second over about one round trip, its recent maximum the path's bandwidth (or the cap, if smaller).
    Uncapped, the window never drops below its initial size (the configured `block_window`: a fast local path's
    round trip is mostly the agent's own processing, which a deeper pipeline hides); under a cap it may drop to
    `capped_minimum`, as in-flight bytes beyond cap x RTT only delay a cap change or a report."""

    def __init__(self, initial: int, block_size: int, *, capped_minimum: int = 2, maximum: int = 256) -> None:
        self.initial, self.capped_minimum = max(1, initial), capped_minimum
        self.maximum = max(self.initial, maximum)
        self.block_size = max(1, block_size)
        self.size = self.initial
        self.srtt_s: float | None = None
        self.min_rtt_s: float | None = None
        self.rate_bps = 0.0
        self._sent: dict[object, float] = {}
        self._span_start: float | None = None
        self._span_bytes = 0

    def sent(self, key: object, now: float) -> None:
        self._sent[key] = now

    def forget(self, key: object) -> None:
        self._sent.pop(key, None)

    def arrived(self, key: object, nbytes: int, now: float, cap: int | None) -> None:
        start = self._sent.pop(key, None)
        if start is None:
            return
        rtt = max(now - start, 1e-6)
        self.srtt_s = rtt if self.srtt_s is None else (1 - RTT_ALPHA) * self.srtt_s + RTT_ALPHA * rtt
        self.min_rtt_s = rtt if self.min_rtt_s is None else min(self.min_rtt_s, rtt)
        if self._span_start is None:
            self._span_start, self._span_bytes = start, 0
        self._span_bytes += nbytes
        span = now - self._span_start
        if span >= max(self.srtt_s, 0.01):  # one sample per round trip: a rate over less is noise
            sample = self._span_bytes / span
            self.rate_bps = max(sample, 0.8 * self.rate_bps)  # the recent maximum, slowly forgotten
            self._span_start, self._span_bytes = now, 0
        self._resize(cap)

    def _resize(self, cap: int | None) -> None:
        if self.min_rtt_s is None or self.rate_bps <= 0:
            return
        rate = min(self.rate_bps, cap) if cap else self.rate_bps
        # The base delay, not the smoothed one: queueing inflates the smoothed RTT and must not grow the window.
        bdp_blocks = rate * self.min_rtt_s / self.block_size
        floor = self.capped_minimum if cap else self.initial
        self.size = max(floor, min(self.maximum, math.ceil(2 * bdp_blocks) + 2))


@dataclass
class _Pending:
    nbytes: int
    since: float


class LinkPacer:
    """The cap and the priority of one device's link (thread-safe; see the module docstring)."""

    def __init__(self, config_cap: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self.config_cap = config_cap
        self.desired_cap: int | None = None
        self._bucket = TokenBucket(config_cap, clock)
        self._pending: dict[int, _Pending] = {}
        self._done_early: set[int] = set()
        self.bulk_bytes = 0  # bundle bytes received since the agent started
        self.report_bytes = 0  # report bytes queued since the agent started
        self.bulk_waits = 0  # requests that yielded to a pending report
        self.window: RttWindow | None = None  # the current download's (reported in telemetry)

    @property
    def cap(self) -> int | None:
        return effective_cap(self.config_cap, self.desired_cap)

    def set_desired_cap(self, cap: int | None) -> None:
        """From the signed desired document in force; takes effect for the next request of a running download."""
        with self._cond:
            if cap != self.desired_cap:
                self.desired_cap = cap
                self._bucket.set_rate(self.cap)
                self._cond.notify_all()

    def apply_desired(self, desired: Desired | None) -> None:
        """The cap of the signed document in force. An expired or absent one leaves the last signed cap in place:
        a paid link does not lose its cap because the control plane went quiet."""
        if desired is not None:
            self.set_desired_cap(desired.max_bytes_per_s)

    # --- reports: called by the MQTT connection for every publish (core.mqtt.PublishObserver)
    def queued(self, mid: int, nbytes: int) -> None:
        with self._cond:
            self.report_bytes += nbytes
            self._bucket.debit(nbytes)
            if mid in self._done_early:
                self._done_early.discard(mid)
                return
            self._pending[mid] = _Pending(nbytes, self._clock())

    def acknowledged(self, mid: int) -> None:
        with self._cond:
            if self._pending.pop(mid, None) is None:
                self._done_early.add(mid)  # the broker answered before `queued` ran (the network thread is fast)
                if len(self._done_early) > 1024:
                    self._done_early.clear()
            self._cond.notify_all()

    @property
    def pending_reports(self) -> int:
        """Reports queued and not yet acknowledged by the broker."""
        with self._cond:
            return len(self._pending)

    def _reports_pending(self, now: float) -> bool:
        for mid in [m for m, p in self._pending.items() if now - p.since > URGENT_MAX_WAIT_S]:
            del self._pending[mid]
        return bool(self._pending)

    # --- bulk: the downloader
    def acquire_bulk(self, nbytes: int, stop: threading.Event | None = None) -> None:
        """Wait until `nbytes` of bundle data may be requested, then charge them."""
        with self._cond:
            while not (stop is not None and stop.is_set()):
                now = self._clock()
                if self._reports_pending(now):
                    self.bulk_waits += 1
                    self._cond.wait(0.01)
                    continue
                delay = self._bucket.delay(nbytes)
                if delay <= 0:
                    break
                self._cond.wait(min(delay, 0.25))
            self._bucket.debit(nbytes)

    def bulk_received(self, nbytes: int) -> None:
        with self._cond:
            self.bulk_bytes += nbytes

    def report(self) -> LinkReport:
        window = self.window
        return LinkReport(
            cap_bytes_per_s=self.cap,
            bulk_bytes=self.bulk_bytes,
            report_bytes=self.report_bytes,
            clock_s=round(self._clock(), 4),
            window=window.size if window else None,
            srtt_ms=round(window.srtt_s * 1000, 3) if window and window.srtt_s else None,
        )


class Pacing:
    """What one download uses: the shared pacer plus its own RTT window. `BlockDownload` calls four hooks."""

    def __init__(self, link: LinkPacer | None, initial_window: int, block_size: int) -> None:
        self.link = link
        self.rtt = RttWindow(initial_window, block_size)
        if link is not None:
            link.window = self.rtt

    def window(self) -> int:
        return self.rtt.size

    def before_request(self, key: object, nbytes: int) -> None:
        if self.link is not None:
            self.link.acquire_bulk(nbytes)
        self.rtt.sent(key, time.monotonic())

    def on_arrival(self, key: object, nbytes: int) -> None:
        self.rtt.arrived(key, nbytes, time.monotonic(), self.link.cap if self.link else None)
        if self.link is not None:
            self.link.bulk_received(nbytes)

    def on_retry(self, key: object) -> None:
        self.rtt.forget(key)
