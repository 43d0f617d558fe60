"""The device link's pacing: the byte-rate cap (token bucket), reports before bundle chunks, the RTT-sized window.

Pure logic with an injected clock; the cap held by a real agent over 30 s is in test_transfer_cap.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from edgefleet.agent.transfer.link import BURST_S, LinkPacer, RttWindow, TokenBucket, effective_cap
from edgefleet.core.messages import Desired

BLOCK = 128 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cap_in_force_is_the_smaller_of_configuration_and_desired_state() -> None:
    assert effective_cap(None, None) is None
    assert effective_cap(500_000, None) == 500_000
    assert effective_cap(None, 200_000) == 200_000
    assert effective_cap(500_000, 200_000) == 200_000
    assert effective_cap(100_000, 200_000) == 100_000  # desired state cannot raise the device's own cap


def test_a_token_bucket_admits_the_rate_and_no_more_than_a_short_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(100_000, clock)
    assert bucket.delay(50_000) == pytest.approx(0.5)  # starts empty: no burst at start
    clock.now += 10.0  # idle for 10 s: the bucket holds only BURST_S of the rate, not 10 s of it
    assert bucket.delay(int(100_000 * BURST_S)) == 0
    assert bucket.delay(int(100_000 * BURST_S) + 10_000) == pytest.approx(0.1)
    bucket.debit(int(100_000 * BURST_S))
    assert bucket.delay(100_000) == pytest.approx(1.0)


def test_over_thirty_seconds_the_bytes_admitted_stay_within_the_cap() -> None:
    clock, cap = Clock(), 250_000
    bucket = TokenBucket(cap, clock)
    start, admitted = clock.now, 0
    while clock.now - start < 30.0:
        wait = bucket.delay(BLOCK)
        if wait > 0:
            clock.now += wait
            continue
        bucket.debit(BLOCK)
        admitted += BLOCK
    rate = admitted / (clock.now - start)
    assert cap * 0.97 <= rate <= cap * 1.03


def test_an_uncapped_bucket_never_waits() -> None:
    bucket = TokenBucket(None, Clock())
    bucket.debit(10**9)
    assert bucket.delay(10**9) == 0


def test_reports_are_charged_to_the_cap_and_hold_bulk_back_until_the_broker_has_them() -> None:
    pacer = LinkPacer(config_cap=None)
    pacer.queued(mid=7, nbytes=300)  # a telemetry publish, not yet acknowledged
    requested = threading.Event()

    def download() -> None:
        pacer.acquire_bulk(BLOCK)
        requested.set()

    worker = threading.Thread(target=download, daemon=True)
    worker.start()
    assert not requested.wait(0.3), "the download asked for a block while a report was waiting"
    pacer.acknowledged(7)
    assert requested.wait(10), "the download did not resume once the report was acknowledged"
    assert pacer.bulk_waits >= 1
    assert pacer.report_bytes == 300


def test_an_acknowledgement_that_beats_its_publish_call_does_not_hold_bulk_back() -> None:
    pacer = LinkPacer()
    pacer.acknowledged(9)  # paho's network thread answered before publish() returned
    pacer.queued(9, 100)
    done = threading.Event()
    threading.Thread(target=lambda: (pacer.acquire_bulk(BLOCK), done.set()), daemon=True).start()
    assert done.wait(10)


def test_a_report_the_broker_never_acknowledges_stops_holding_bulk_after_a_bound() -> None:
    clock = Clock()
    pacer = LinkPacer(clock=clock)
    pacer.queued(3, 100)
    clock.now += 5.0  # the connection dropped: no PUBACK will come
    pacer.acquire_bulk(BLOCK)  # returns
    assert pacer.report().bulk_bytes == 0


def test_signed_desired_state_sets_the_cap_and_an_expired_or_absent_document_keeps_it() -> None:
    pacer = LinkPacer(config_cap=1_000_000)
    desired = Desired(bundle_id="b", model_name="m", model_version="1", profile="p", max_bytes_per_s=200_000)
    pacer.apply_desired(desired)
    assert pacer.cap == 200_000
    pacer.apply_desired(None)
    assert pacer.cap == 200_000
    pacer.apply_desired(desired.model_copy(update={"max_bytes_per_s": None}))
    assert pacer.cap == 1_000_000
    assert pacer.report().cap_bytes_per_s == 1_000_000


def test_a_desired_document_without_the_cap_field_still_parses() -> None:
    older = '{"schema_version": 1, "bundle_id": "b", "model_name": "m", "model_version": "1", "profile": "p"}'
    assert Desired.model_validate_json(older).max_bytes_per_s is None


def _feed(window: RttWindow, rtt_s: float, rate_bps: float, blocks: int, cap: int | None = None) -> None:
    """Blocks requested back to back and answered after `rtt_s`, at `rate_bps`."""
    now = 0.0
    for i in range(blocks):
        window.sent(i, now)
        now += window.block_size / rate_bps
        window.arrived(i, window.block_size, now + rtt_s, cap)


def test_the_window_grows_to_fill_a_long_fat_link() -> None:
    window = RttWindow(16, BLOCK)
    _feed(window, rtt_s=0.6, rate_bps=20e6, blocks=400)  # 600 ms at 20 MB/s: 12 MB in flight to fill it
    assert window.size >= 2 * 0.6 * 20e6 / BLOCK * 0.8
    assert window.size <= window.maximum


def test_a_fast_local_link_keeps_the_configured_window() -> None:
    window = RttWindow(16, BLOCK)
    _feed(window, rtt_s=0.001, rate_bps=200e6, blocks=200)
    assert window.size == 16


def test_under_a_cap_the_window_shrinks_to_what_the_cap_needs() -> None:
    window = RttWindow(16, BLOCK)
    _feed(window, rtt_s=0.05, rate_bps=200_000, blocks=60, cap=200_000)
    assert window.size < 16
    assert window.size >= window.capped_minimum


def test_a_real_connection_tells_the_pacer_of_each_publish_and_its_acknowledgement(mosquitto) -> None:  # type: ignore[no-untyped-def]
    from edgefleet.core.mqtt.connection import Connection

    pacer = LinkPacer(config_cap=None)
    conn = Connection(mosquitto.url, "test-pacer-observer", observer=pacer).start()
    try:
        for _ in range(5):
            conn.publish("test/pacer/report", b"r" * 100, qos=1, wait=10)
        conn.publish("test/pacer/answer", b"a" * 50, qos=0)
        assert pacer.report_bytes == 550
        deadline = time.monotonic() + 30
        while pacer.pending_reports and time.monotonic() < deadline:  # the QoS 0 one: once paho has written it
            time.sleep(0.01)
        assert pacer.pending_reports == 0, "every report the broker has is released, not held until it expires"
    finally:
        conn.stop()
