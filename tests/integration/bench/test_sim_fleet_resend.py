"""The fleet bench's simulated devices keep their reports until the host stored them, as the agent does.

The same setting as tests/integration/agent/test_report_durability.py, with simulated devices in place of the agent
process: a real Mosquitto whose per-client queue holds 5 messages, and a host that stores reports and publishes
`StoredUpTo` (support/servers/stored_host.py). While the host is down the broker acknowledges every report and
drops what exceeds the host's queue; the simulated devices send those again until they are stored, never one
already stored, and a full spool says which numbers will never come.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from edgefleet.core.topics import Topics

from support.rollouts.control_plane import wait_until
from support.servers.brokers import MosquittoBroker
from support.servers.stored_host import StoringHost
from support.simulate.agents import SimFleet
from support.simulate.spool import ResendPolicy

QUEUE = 5
DEVICES = ["sim-resend-a", "sim-resend-b"]


@pytest.fixture
def broker() -> Iterator[MosquittoBroker]:
    with MosquittoBroker(extra_config=[f"max_queued_messages {QUEUE}"]) as running:
        yield running


def _outage(broker: MosquittoBroker, policy: ResendPolicy, down_s: float) -> tuple[StoringHost, SimFleet, list[int]]:
    """The host stores for a while, is down `down_s`, comes back; (host, fleet, highest number heard before)."""
    host = StoringHost(broker.url, Topics()).start()
    fleet = SimFleet(broker.url, DEVICES, telemetry_interval=0.2, resend=policy).start()
    assert fleet.wait_connected(30)
    for device in DEVICES:
        ledger = host.ledger(device)
        wait_until(
            "the host storing and acknowledging reports", lambda ledger=ledger: ledger.contiguous() >= 5, timeout=60
        )
    host.stop()  # down: the broker takes (PUBACKs) every report and keeps 5 of them for the host
    before = [max(seq for seq, _ in host.ledger(d).arrivals) for d in DEVICES]
    time.sleep(down_s)
    host.start()
    return host, fleet, before


def test_reports_the_broker_dropped_for_a_host_that_was_down_are_sent_again_until_stored(
    broker: MosquittoBroker,
) -> None:
    host, fleet, before = _outage(broker, ResendPolicy(resend_after_s=2.0), down_s=2.0)
    try:
        for device, highest in zip(DEVICES, before, strict=True):
            ledger = host.ledger(device)
            wait_until(
                "every report stored, none missing",
                lambda ledger=ledger, n=highest: ledger.caught_up(n + 10),
                timeout=60,
            )
            assert ledger.filled_late(), "the broker dropped reports while the host was down (else this proves nothing)"
            assert ledger.resent_after_ack(grace_s=2.0) == [], "a report already stored is never sent again"
            assert ledger.lost_through == 0, "nothing was lost: the spool had room"
        assert fleet.snapshot()["resent"] > 0
        wait_until("the spools pruned once stored", lambda: fleet.spooled()["depth"] <= 4 * len(DEVICES), timeout=30)
    finally:
        fleet.stop()
        host.stop()


def test_a_full_spool_says_which_numbers_it_dropped_so_the_host_count_moves_past_them(
    broker: MosquittoBroker,
) -> None:
    host, fleet, before = _outage(broker, ResendPolicy(max_records=10, resend_after_s=2.0), down_s=5.0)
    try:
        for device, highest in zip(DEVICES, before, strict=True):
            ledger = host.ledger(device)
            wait_until("the host's contiguous count past the dropped numbers",
                  lambda ledger=ledger, n=highest: ledger.caught_up(n + 25), timeout=90)  # fmt: skip
            assert ledger.lost_through > 0
            assert set(range(1, ledger.lost_through + 1)) - ledger.stored, "the spool dropped numbers never sent"
        stats = fleet.snapshot()
        assert stats["spool_dropped"] > 0
        # one announcement per new drop, not a storm: at most one per report the device made
        assert 0 < stats["drops_announced"] <= stats["telemetry_sent"]
    finally:
        fleet.stop()
        host.stop()
