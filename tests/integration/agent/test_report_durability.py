"""A report stays on the device until the control plane has STORED it, not merely until the broker took it.

A real Mosquitto whose per-client queue holds 5 messages, a real agent process, and a host that stores reports
and publishes `StoredUpTo` as the core contract says (support/stored_host.py). While the host is down the broker
acknowledges every report to the device and drops what exceeds the host's queue: the device sends those again
until they are stored, never one already stored, across an agent restart; and when its own spool overflows it
says which numbers will never come, so the host's contiguous count still reaches the last report.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.fleet import AgentProcess, FleetWatcher
from support.rollouts.control_plane import wait_until
from support.servers.brokers import MosquittoBroker
from support.servers.stored_host import StoringHost

QUEUE = 5  # what the broker queues for a subscriber that is away; the rest it drops (after its PUBACK)


@pytest.fixture
def broker() -> Iterator[MosquittoBroker]:
    with MosquittoBroker(extra_config=[f"max_queued_messages {QUEUE}"]) as running:
        yield running


def _agent(device: str, broker: MosquittoBroker, tmp_path: Path, root_pub: Path, *extra: str) -> AgentProcess:
    return AgentProcess(device, tmp_path / device, broker=broker.url, trust=root_pub, telemetry_interval=0.2,
                        extra=("--report-resend-after", "2", *extra)).start()  # fmt: skip


@pytest.mark.slow
def test_reports_the_broker_dropped_for_a_host_that_was_down_are_sent_again_until_stored(
    broker: MosquittoBroker, tmp_path: Path, root_pub: Path
) -> None:
    device, topics = "dev-durable", Topics()
    host = StoringHost(broker.url, topics).start()
    watcher_conn = Connection(broker.url, "test-durable-watcher").start()  # hears every report live, host or not
    watcher = FleetWatcher(watcher_conn, topics)
    agent = _agent(device, broker, tmp_path, root_pub)
    try:
        ledger = host.ledger(device)
        wait_until("the host storing and acknowledging reports", lambda: ledger.contiguous() >= 5, timeout=60)
        host.stop()  # down: the broker takes (PUBACKs) every report and keeps 5 of them for the host
        before = max(seq for seq, _ in ledger.arrivals)
        heard = len(watcher.telemetry)
        time.sleep(2.0)
        agent.stop()  # what the broker took but the host never stored must survive the agent's restart
        agent.start()
        time.sleep(2.0)
        while_down = [t.seq for t in watcher.telemetry[heard:] if t.device_id == device]
        host.start()
        # Numbers run on from `before` with no gap, so a report numbered past the host's queue of QUEUE, published
        # while it was away, is one the broker acknowledged and dropped (whichever order its re-send then arrives
        # in: the count of reports heard late varies with timing, CI saw none on a loaded machine).
        dropped = [seq for seq in while_down if seq > before + QUEUE]
        assert dropped, (
            f"the broker dropped reports while the host was down (else this test proves nothing): {while_down}"
        )
        target = max(dropped)
        wait_until("every report stored, none missing", lambda: ledger.caught_up(target), timeout=90)
        assert set(dropped) <= ledger.stored, "what the broker dropped was sent again and stored"
        assert ledger.resent_after_ack(grace_s=2.0) == [], "a report already stored is never sent again"
        assert ledger.lost_through == 0, "nothing was lost: the spool had room"
    finally:
        agent.stop()
        host.stop()
        watcher_conn.stop()
    assert "Traceback" not in agent.log()


def test_a_full_spool_says_which_numbers_it_dropped_so_the_host_count_moves_past_them(
    broker: MosquittoBroker, tmp_path: Path, root_pub: Path
) -> None:
    device, topics = "dev-overflow", Topics()
    host = StoringHost(broker.url, topics).start()
    watcher_conn = Connection(broker.url, "test-overflow-watcher").start()
    watcher = FleetWatcher(watcher_conn, topics)
    agent = _agent(device, broker, tmp_path, root_pub, "--spool-max", "10")
    try:
        ledger = host.ledger(device)
        wait_until("the host storing and acknowledging reports", lambda: ledger.contiguous() >= 5, timeout=60)
        host.stop()
        time.sleep(5.0)  # 25 reports at 0.2 s: the spool keeps the newest 10
        host.start()
        wait_until("the host's contiguous count past the dropped numbers", lambda: ledger.caught_up(30), timeout=90)
        assert ledger.lost_through > 0
        dropped = next(e for e in watcher.events if e.device_id == device and e.kind == "reports-dropped")
        assert dropped.dropped_through and dropped.dropped_through <= ledger.lost_through
        lost = set(range(1, ledger.lost_through + 1)) - ledger.stored
        assert lost, "some numbers were never delivered: the spool dropped them"
        reports = [t for t in watcher.telemetry if t.device_id == device]
        assert reports[-1].spool_dropped > 0
        wait_until("the spool pruned once stored", lambda: [t for t in watcher.telemetry if t.device_id == device
                                                       and t.spool_depth <= 3], timeout=30)  # fmt: skip
    finally:
        agent.stop()
        host.stop()
        watcher_conn.stop()
