"""The store's columns are as wide on PostgreSQL as on SQLite (issue 32: a 32-bit INTEGER on PostgreSQL refused
counts SQLite stored), and a store holding rows from before ingest bounded numbers is cleaned when it migrates."""

from __future__ import annotations

import math
import time

from edgefleet.control.store import Store, open_store
from edgefleet.core.messages import MAX_WINDOW_COUNT, LatencySummary, Telemetry


def report(device: str, seq: int, ts: float, requests: int) -> Telemetry:
    return Telemetry(
        device_id=device, seq=seq, ts=ts, bundle_id="b1", provider="cpu", window_s=1.0, requests=requests,
        errors=requests, throughput_rps=1.0, latency=LatencySummary(count=requests, p50_ms=1.0, p95_ms=2.0,
        p99_ms=3.0), golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=5.0, rss_mb=50.0,
    )  # fmt: skip


def test_counts_past_32_bits_are_stored_and_summed_on_both_backends(store: Store) -> None:
    """The most a report may count (2^32) is stored as is, and a bucket of such reports sums past 2^33."""
    now = time.time()
    old = now - 7200.0
    reports = [report("d1", seq, old + seq, MAX_WINDOW_COUNT) for seq in range(1, 4)]
    assert store.add_telemetry(reports, now) == 3
    assert [p.requests for p in store.telemetry("d1", 0.0)] == [MAX_WINDOW_COUNT] * 3
    assert store.latest_telemetry()[("d1", "default")].latency_count == MAX_WINDOW_COUNT
    moved, _ = store.downsample(now, raw_retention_s=3600.0, bucket_s=3600.0)
    assert moved == 3
    series = store.series("d1", old - 3600.0, now, 3600.0)
    assert sum(p.requests for p in series) == 3 * MAX_WINDOW_COUNT and sum(p.errors for p in series) > 2**33


def test_rows_from_before_the_bounds_are_deleted_when_the_store_migrates(store_url: str) -> None:
    """Rows written before this version (simulated by writing them past ingest, then undoing the migration's record)
    that hold negative counters, infinite figures or a date in the far future are gone once the store reopens; the
    plausible ones stay."""
    now = time.time()
    store = open_store(store_url)
    try:
        store.add_telemetry([report("good", 1, now - 10, 5)], now)
        columns = ("device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms, p99_ms,"
                   " latency_count, golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c,"
                   " received_at")  # fmt: skip
        bad = [
            ("neg", 1, now - 5, "b1", "cpu", 1.0, -7, 0, 1.0, 1.0, 1.0, 1, 1.0, 0.0, 1.0, 1.0, None, now),
            ("inf", 1, now - 5, "b1", "cpu", 1.0, 1, 0, 1.0, math.inf, 1.0, 1, 1.0, 0.0, -math.inf, 1.0, None, now),
            ("future", 1, 1e15, "b1", "cpu", 1.0, 1, 0, 1.0, 1.0, 1.0, 1, 1.0, 0.0, 1.0, 1.0, None, now),
        ]
        marks = ", ".join("?" for _ in bad[0])
        with store.db.tx() as db:
            for table in ("telemetry", "latest_telemetry"):
                for row in bad:
                    db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", row)
            db.execute("DELETE FROM schema_version WHERE version >= 10")
        assert {d for d, _slot in store.latest_telemetry()} == {"good", "neg", "inf", "future"}
    finally:
        store.close()
    store = open_store(store_url)  # migrates to version 10 again
    try:
        assert {d for d, _slot in store.latest_telemetry()} == {"good"}
        assert [store.telemetry_count(d) for d in ("good", "neg", "inf", "future")] == [1, 0, 0, 0]
    finally:
        store.close()
