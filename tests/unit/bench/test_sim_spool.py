"""The fleet bench's simulated devices keep the agent's report spool (tests/support/simulate/spool.py): each step is
run on the agent's own disk `Spool` (agent/telemetry/spool.py) and on the simulator's `MemorySpool`, and both must
hold, re-send and drop the same reports."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from edgefleet.agent.daemon.config import AgentConfig
from edgefleet.agent.telemetry.reporter import Reporter
from edgefleet.agent.telemetry.spool import Spool

from support.simulate.spool import MemorySpool, ResendPolicy

TOPIC = "edgefleet/v1/devices/d1/telemetry"


class Pair:
    """The agent's spool and the simulator's, driven by the same steps."""

    def __init__(self, tmp_path: Path, policy: ResendPolicy) -> None:
        self.agent = Spool(tmp_path / "outbox.sqlite", policy.max_records)
        if policy.storage_acks_known:
            self.agent.set_counter("stored_acks", 1)
        self.sim = MemorySpool(policy)

    def put(self, count: int) -> None:
        for _ in range(count):
            seq = self.agent.put(TOPIC, lambda n: f'{{"seq":{n}}}'.encode())
            self.sim.put(seq, "telemetry", TOPIC, f'{{"seq":{seq}}}'.encode())

    def send_unsent(self, now: float) -> list[int]:
        """Publish what is unsent, every PUBACK arriving at `now`; the numbers sent (the same on both sides)."""
        agent = self.agent.unsent(limit=10_000)
        self.agent.sent(agent, now)
        sim = self.sim.flush(now)
        for record in sim:
            self.sim.acked(record.seq, now)
        assert [r.seq for r in sim] == [r.seq for r in agent]
        return [r.seq for r in agent]

    def stored(self, up_to: int) -> None:
        self.agent.stored(up_to)
        self.sim.stored(up_to)

    def held(self) -> list[int]:
        records = self.agent.unsent(limit=10**6) + self.agent.due(sent_before=float("inf"), limit=10**6)
        agent = sorted(r.seq for r in records if r.seq is not None)
        assert self.sim.spooled() == agent
        return agent


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    return Pair(tmp_path, ResendPolicy(max_records=100, resend_after_s=30.0, resend_per_s=50.0))


def test_the_simulated_devices_follow_the_agents_default_configuration() -> None:
    policy = ResendPolicy.agent_defaults()
    fields = AgentConfig.model_fields
    assert policy.max_records == fields["spool_max_records"].default
    assert policy.resend_after_s == fields["report_resend_after_s"].default
    assert policy.resend_per_s == fields["report_resend_per_s"].default
    reporter = inspect.signature(Reporter).parameters
    assert (policy.resend_after_s, policy.resend_per_s) == (
        reporter["resend_after_s"].default, reporter["resend_per_s"].default,
    )  # fmt: skip
    assert policy.max_records == inspect.signature(Spool).parameters["max_records"].default


def test_a_report_the_broker_took_stays_spooled_until_the_control_plane_says_it_is_stored(pair: Pair) -> None:
    pair.put(5)
    assert pair.send_unsent(now=100.0) == [1, 2, 3, 4, 5]
    assert pair.held() == [1, 2, 3, 4, 5]  # a PUBACK only marks it sent
    pair.stored(3)
    assert pair.held() == [4, 5]
    assert pair.sim.unsent() == []  # sent once, never offered again as new


def test_what_is_not_stored_is_sent_again_after_the_agents_delay_lowest_number_first_at_its_rate(pair: Pair) -> None:
    pair.put(80)
    pair.send_unsent(now=1000.0)
    pair.stored(4)
    assert pair.sim.flush(1020.0) == []  # 20 s: not due yet
    due = pair.sim.flush(1031.0)
    assert [r.seq for r in due] == [r.seq for r in pair.agent.due(1031.0 - 30.0, 50)] == list(range(5, 55))
    assert pair.sim.flush(1031.0) == []  # the rate's tokens are spent, and those are in flight
    for record in due:
        pair.sim.acked(record.seq, 1031.2)
    assert [r.seq for r in pair.sim.flush(1031.5)] == list(range(55, 80))  # half a second: 25 more tokens
    assert pair.sim.resent == 75


def test_a_re_send_covered_meanwhile_is_never_sent(pair: Pair) -> None:
    pair.put(10)
    pair.send_unsent(now=0.0)
    pair.stored(10)
    assert pair.sim.flush(100.0) == []
    assert pair.agent.due(100.0 - 30.0, 50) == []


def test_a_full_spool_drops_its_oldest_counts_them_and_says_which_numbers_will_never_come(tmp_path: Path) -> None:
    pair = Pair(tmp_path, ResendPolicy(max_records=10))
    pair.put(15)
    assert pair.held() == list(range(6, 16))
    assert (pair.sim.dropped, pair.sim.dropped_through) == (pair.agent.dropped(), pair.agent.dropped_through()) == (
        5, 5,
    )  # fmt: skip
    assert pair.sim.next_to_drop() == pair.agent.next_to_drop() == 6
    through = pair.sim.drops_to_announce()
    assert through == 6  # the announcement pushes out report 6 too, and says so
    pair.sim.announced(through)
    pair.sim.put(16, "event", TOPIC, b"{}")  # the reports-dropped event
    assert (pair.sim.dropped, pair.sim.dropped_through) == (6, 6)
    assert pair.sim.drops_to_announce() is None  # said once


def test_drops_the_host_already_stored_are_not_announced(tmp_path: Path) -> None:
    pair = Pair(tmp_path, ResendPolicy(max_records=10))
    pair.put(10)
    pair.send_unsent(now=0.0)
    pair.put(2)  # 1 and 2 dropped
    pair.stored(2)
    assert pair.sim.drops_to_announce() is None


def test_before_the_first_storage_acknowledgement_a_puback_deletes_the_report(tmp_path: Path) -> None:
    pair = Pair(tmp_path, ResendPolicy(storage_acks_known=False))
    pair.put(3)
    pair.send_unsent(now=0.0)
    assert pair.held() == []  # as an agent does under a control plane that predates StoredUpTo
    assert pair.sim.drops_to_announce() is None
    pair.put(2)
    pair.stored(3)  # the first acknowledgement: from now on a report waits for it
    pair.send_unsent(now=1.0)
    assert pair.held() == [4, 5]


def test_a_lost_connection_offers_again_what_was_in_flight(pair: Pair) -> None:
    pair.put(3)
    in_flight = pair.sim.flush(0.0)
    pair.sim.acked(in_flight[0].seq, 0.1)
    assert pair.sim.flush(0.2) == []  # 2 and 3 are still in flight
    pair.sim.disconnected()
    assert [r.seq for r in pair.sim.flush(0.3)] == [2, 3]  # the publish failed: they were never taken


def test_the_delay_to_stored_counts_from_the_first_send(pair: Pair) -> None:
    pair.put(1)
    pair.send_unsent(now=10.0)
    for record in pair.sim.flush(45.0):  # re-sent once
        pair.sim.acked(record.seq, 45.0)
    (record,) = pair.sim.stored(1)
    assert (record.first_sent, record.sent, record.sends) == (10.0, 45.0, 2)
