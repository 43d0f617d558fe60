"""The offline outbox: ordered, bounded with counted drops, and durable across restarts."""

from __future__ import annotations

from pathlib import Path

from edgefleet.agent.health import judge_health
from edgefleet.agent.spool import Spool
from edgefleet.core.golden import GoldenResult


def test_records_come_back_in_order_until_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for i in range(5):
        spool.put("t", f"m{i}".encode())
    batch = spool.next_batch(3)
    assert [r.payload for r in batch] == [b"m0", b"m1", b"m2"]
    spool.ack([r.rowid for r in batch[:2]])
    assert [r.payload for r in spool.next_batch()] == [b"m2", b"m3", b"m4"]


def test_a_full_spool_drops_the_oldest_and_counts_the_drops(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_records=10)
    for i in range(25):
        spool.put("t", str(i).encode())
    assert spool.depth() == 10 and spool.dropped() == 15
    assert spool.next_batch(1)[0].payload == b"15"


def test_records_and_counters_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_records=10)
    spool.put("t", b"kept")
    assert [spool.next_sequence() for _ in range(3)] == [1, 2, 3]
    spool.close()
    reopened = Spool(tmp_path / "s.sqlite", max_records=10)
    assert [r.payload for r in reopened.next_batch()] == [b"kept"]
    assert reopened.next_sequence() == 4


GOOD = GoldenResult(1.0, 0.0, True, "ok")
BAD = GoldenResult(0.2, 3.0, False, "max |error| 3 exceeds the tolerance 0.01")


def test_health_table() -> None:
    common = {"files_reason": "", "max_failure_ratio": 0.5, "min_requests": 20}
    assert judge_health(files_ok=True, golden=GOOD, failure_ratio=0.0, requests_seen=0, **common).healthy
    assert not judge_health(files_ok=False, golden=GOOD, failure_ratio=0, requests_seen=0, **common).healthy
    assert (
        "golden set no longer passes"
        in judge_health(files_ok=True, golden=BAD, failure_ratio=0, requests_seen=0, **common).reason
    )
    assert judge_health(files_ok=True, golden=GOOD, failure_ratio=1.0, requests_seen=5, **common).healthy, (
        "too few requests to judge"
    )
    assert (
        "60% of the last 20 requests failed"
        in judge_health(files_ok=True, golden=GOOD, failure_ratio=0.6, requests_seen=20, **common).reason
    )
