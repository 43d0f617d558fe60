"""Property test of ingest with arbitrary numbers (issue 32, items 5 and 10), through the ingest writer
(control/fleet/ingest.py `Ingestor._commit`) into a real SQLite store: whatever numbers one device puts in a report,
ingest raises nothing, acknowledges the message, stores no number that is non-finite or outside its bounds, and
leaves another device's rows as they were."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefleet.control.fleet.ingest import Ingestor
from edgefleet.control.store import Store, open_store
from edgefleet.core.messages import (
    MAX_CPU_PERCENT,
    MAX_MS,
    MAX_WINDOW_COUNT,
    DeviceStatus,
    LatencySummary,
    Telemetry,
)
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

TOPICS = Topics()
ATTACKER, NEIGHBOUR = "prop-attacker", "prop-neighbour"
NUMBERS = ["seq", "window_s", "requests", "errors", "throughput_rps", "golden_agreement", "golden_max_abs_error",
           "cpu_percent", "rss_mb", "temperature_c", "queue_depth", "field_accuracy", "field_samples",
           "spool_depth", "spool_dropped", "probe_requests", "ts"]  # fmt: skip
LATENCY = ["count", "p50_ms", "p95_ms", "p99_ms"]

numbers = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, -1, 2**31, 2**32, 2**53, 2**62, 2**63, 1e15, -0.0, 1e308, math.inf, -math.inf, math.nan])
)


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Ingestor, Store]]:
    path: Path = tmp_path_factory.mktemp("ingest") / "control.sqlite"
    store = open_store(f"sqlite://{path}")
    now = time.time()
    store.upsert_statuses([DeviceStatus(device_id=d, online=True, state="idle") for d in (ATTACKER, NEIGHBOUR)], now)
    neighbour = Telemetry(
        device_id=NEIGHBOUR, seq=1, ts=now, bundle_id=None, provider="cpu", window_s=1.0, requests=3, errors=0,
        throughput_rps=3.0, latency=LatencySummary(count=3, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0),
        golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=10.0, rss_mb=50.0,
    )  # fmt: skip
    store.add_telemetry([neighbour], now)
    # An unstarted connection: `_commit` writes to the store and publishes nothing (acknowledgements go out later).
    ingestor = Ingestor(Connection("mqtt://127.0.0.1:1", "prop"), TOPICS, store)
    yield ingestor, store
    store.close()


def rows(store: Store, device: str) -> list[Any]:
    return [*store.telemetry(device, 0.0), store.latest_telemetry().get((device, "default"))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    top=st.dictionaries(st.sampled_from(NUMBERS), numbers, min_size=1, max_size=4),
    latency=st.dictionaries(st.sampled_from(LATENCY), numbers, max_size=2),
    seq=st.integers(min_value=1, max_value=2**40),
)
def test_arbitrary_numbers_are_stored_within_bounds_or_refused_and_touch_no_other_device(
    plant: tuple[Ingestor, Store], top: dict[str, Any], latency: dict[str, Any], seq: int
) -> None:
    ingestor, store = plant
    before = rows(store, NEIGHBOUR)
    report: dict[str, Any] = {
        "schema_version": 1, "device_id": ATTACKER, "seq": seq, "ts": time.time(), "bundle_id": None,
        "provider": "cpu", "window_s": 1.0, "requests": 1, "errors": 0, "throughput_rps": 1.0,
        "latency": {"count": 1, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0} | latency, "golden_agreement": None,
        "golden_max_abs_error": None, "cpu_percent": 1.0, "rss_mb": 1.0,
    } | top  # fmt: skip
    acked: list[bool] = []
    item = (
        "telemetry",
        TOPICS.telemetry(ATTACKER),
        json.dumps(report).encode(),
        time.time(),
        lambda: acked.append(True),
    )
    assert ingestor._commit([item])  # raises nothing, gives up on nothing
    assert acked == [True], "every message is acknowledged: stored or refused, never left to be re-sent for ever"
    for point in rows(store, ATTACKER):
        if point is None:
            continue
        floats = [point.ts, point.window_s, point.cpu_percent, point.rss_mb, point.p50_ms, point.p95_ms,
                  point.p99_ms, point.golden_agreement, point.golden_max_abs_error, point.temperature_c]  # fmt: skip
        assert all(math.isfinite(v) for v in floats if v is not None), point
        assert 0 <= point.requests <= MAX_WINDOW_COUNT and 0 <= point.errors <= MAX_WINDOW_COUNT, point
        assert 0 <= point.latency_count <= MAX_WINDOW_COUNT and 0 <= point.cpu_percent <= MAX_CPU_PERCENT, point
        assert all(0 <= v < MAX_MS for v in (point.p50_ms, point.p95_ms, point.p99_ms) if v is not None), point
        assert point.ts <= time.time() + 300, point
    assert rows(store, NEIGHBOUR) == before
