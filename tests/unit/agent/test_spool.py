"""The report outbox: one gap-free sequence, kept until the host stored it, bounded with counted drops, durable."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.agent.install.health import judge_health
from edgefleet.agent.telemetry.reporter import Reporter
from edgefleet.agent.telemetry.spool import Record, Spool
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.quality.golden import GoldenResult
from edgefleet.core.topics import Topics


def report(text: str) -> Callable[[int], bytes]:
    return lambda seq: json.dumps({"seq": seq, "text": text}).encode()


def texts(records: list[Record]) -> list[str]:
    return [json.loads(r.payload)["text"] for r in records]


def test_each_report_takes_the_next_number_in_the_write_that_spools_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    assert [spool.put("t", report(f"m{i}")) for i in range(3)] == [1, 2, 3]

    def full_disk(seq: int) -> bytes:
        raise OSError("no space left on device")

    with pytest.raises(OSError):
        spool.put("t", full_disk)
    assert spool.put("t", report("m3")) == 4, "a report that could not be spooled takes no number: no gap"
    assert [json.loads(r.payload)["seq"] for r in spool.unsent()] == [1, 2, 3, 4] == [r.seq for r in spool.unsent()]


def test_before_the_host_acknowledges_storage_the_broker_ack_deletes(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for i in range(5):
        spool.put("t", report(f"m{i}"))
    batch = spool.unsent(3)
    assert texts(batch) == ["m0", "m1", "m2"]
    spool.sent(batch[:2], at=100.0)
    assert texts(spool.unsent()) == ["m2", "m3", "m4"] and spool.depth() == 3


def test_once_the_host_acknowledges_storage_a_report_stays_until_stored(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for i in range(6):
        spool.put("t", report(f"m{i}"))
    assert spool.stored(0) == 0 and spool.acknowledges_storage()
    spool.sent(spool.unsent(4), at=100.0)  # the broker took 1..4
    assert texts(spool.unsent()) == ["m4", "m5"] and spool.depth() == 6
    assert spool.due(sent_before=100.0, limit=10) == [], "sent at 100: not due before"
    assert texts(spool.due(sent_before=100.5, limit=10)) == ["m0", "m1", "m2", "m3"]
    assert spool.stored(2) == 2  # the host stored 1..2
    assert texts(spool.due(sent_before=100.5, limit=10)) == ["m2", "m3"], "a stored report is never due again"
    assert texts(spool.due(sent_before=100.5, limit=1)) == ["m2"]
    spool.stored(1)  # an older acknowledgement (a stale retained message) changes nothing
    assert spool.stored_up_to() == 2 and spool.depth() == 4


def test_a_full_spool_drops_the_oldest_and_says_which_numbers_are_lost(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_records=10)
    for i in range(25):
        spool.put("t", report(str(i)))
    assert spool.depth() == 10 and spool.dropped() == 15 and spool.dropped_through() == 15
    assert texts(spool.unsent(1)) == ["15"]


def test_records_numbers_and_acknowledgements_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_records=10)
    for text in ("a", "b", "c"):
        spool.put("t", report(text))
    spool.stored(1)
    spool.close()
    reopened = Spool(tmp_path / "s.sqlite", max_records=10)
    assert texts(reopened.unsent()) == ["b", "c"]
    assert reopened.put("t", report("d")) == 4
    assert reopened.stored_up_to() == 1 and reopened.acknowledges_storage()


def test_an_outbox_from_before_stored_acknowledgements_keeps_its_records_and_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL)")
    db.execute("CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    db.executemany("INSERT INTO outbox (topic, payload) VALUES (?, ?)", [("t", report(t)(n)) for n, t in ((7, "x"),
                   (8, "y"))])  # fmt: skip
    db.execute("INSERT INTO counters VALUES ('sequence', 8)")
    db.commit()
    db.close()
    spool = Spool(path)
    assert [r.seq for r in spool.unsent()] == [7, 8]
    assert spool.put("t", report("z")) == 9


def test_a_device_whose_state_was_reset_numbers_its_reports_above_what_the_host_stored(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for text in ("a", "b"):
        spool.put("t", report(text))
    assert spool.renumber_above(500) == 503
    assert [json.loads(r.payload)["seq"] for r in spool.unsent()] == [501, 502] == [r.seq for r in spool.unsent()]
    assert spool.put("t", report("c")) == 503


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


def test_a_full_spool_announces_its_drops_once_and_the_announcement_names_the_report_it_pushes_out(
    tmp_path: Path,
) -> None:
    """The `reports-dropped` event takes a place in the full spool too: it must cover the report it pushes out,
    or every announcement drops one more report and calls for another (the flush loop turning as fast as it can,
    the spool filled with announcements in seconds)."""
    spool = Spool(tmp_path / "s.sqlite", max_records=10)
    spool.stored(0)  # the host acknowledges storage: reports wait for it
    for i in range(15):
        spool.put("edgefleet/v1/devices/d1/telemetry", report(str(i)))
    assert spool.dropped_through() == 5
    offline = Connection("mqtt://127.0.0.1:9", "test-announce")  # never started: nothing is published
    reporter = Reporter(offline, Topics(), "d1", spool)
    stop = threading.Event()
    flush = threading.Thread(target=reporter.run_flush, args=(stop,), daemon=True)
    flush.start()
    time.sleep(1.5)  # a looping announcer makes hundreds of events in this time
    stop.set()
    flush.join(10)
    events = [json.loads(r.payload) for r in spool.unsent(100) if r.topic.endswith("/events")]
    assert [e["kind"] for e in events] == ["reports-dropped"]
    assert events[0]["dropped_through"] == spool.dropped_through() == 6  # it names the report it pushed out
    assert spool.depth() == 10 and spool.dropped() == 6
