"""Ingestion on a real Mosquitto: shared subscriptions split the load, repeats are stored once, bad input is
counted and never stops the control plane."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from edgefleet.control.broker.embedded import EmbeddedBroker
from edgefleet.control.server import ControlPlane
from edgefleet.control.store import Store
from edgefleet.control.store.sql.sqlite import SqliteDatabase
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, StoredUpTo, Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.fleet import AgentProcess
from support.rollouts.control_plane import control_config, control_plane, sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker


def test_two_control_planes_split_the_telemetry_and_store_every_report_once(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    devices = [f"split-{i}" for i in range(20)]
    with (
        control_plane(mosquitto.url, tmp_path, engine=False) as a,
        control_plane(mosquitto.url, tmp_path, engine=False, protocol="3.1.1") as b,
        sim_fleet(mosquitto.url, devices, telemetry_interval=0.1) as fleet,
    ):
        # Enough reports to split between the two, however slowly a loaded machine runs the simulator.
        wait_until("over 400 reports sent", lambda: fleet.stats.telemetry_sent > 20 * 20, timeout=120)
        fleet.stop(drain_s=60.0)  # returns as soon as every report is acknowledged
        assert a.ingestor is not None and b.ingestor is not None
        assert a.ingestor.drain() and b.ingestor.drain()
        stats = fleet.stats
        assert stats.telemetry_acked == stats.telemetry_sent > 20 * 20, "the simulator waits for every PUBACK"
        stored = a.store.telemetry_count()
        got_a = a.ingestor.stats.counts["telemetry"]
        got_b = b.ingestor.stats.counts["telemetry"]
        assert stored == stats.telemetry_acked, "every acknowledged report is stored"
        assert got_a + got_b == stored and got_a > stored * 0.2 and got_b > stored * 0.2, (got_a, got_b)
        assert {d.device_id for d in a.store.devices()} >= set(devices)
        # Both processes see every status (plain subscription), so both know the whole registry.
        assert a.ingestor.stats.counts["statuses"] >= 20 and b.ingestor.stats.counts["statuses"] >= 20


POISON = 10**6  # the sequence number of the report the store refuses (test_a_message_the_store_refuses_...)


def _report(device: str, seq: int) -> bytes:
    return Telemetry(
        device_id=device, seq=seq, bundle_id=None, provider=None, window_s=1.0, requests=0, errors=0,
        throughput_rps=0.0, latency=LatencySummary(count=0, p50_ms=None, p95_ms=None, p99_ms=None),
        golden_agreement=None, golden_max_abs_error=None, cpu_percent=1.0, rss_mb=1.0,
    ).encode()  # fmt: skip


def test_the_control_plane_acknowledges_what_it_stored_and_a_real_agent_prunes_its_spool_to_it(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, topics: Topics, root_pub: Path
) -> None:
    """The storage acknowledgement (core `StoredUpTo`), end to end: the control plane publishes, retained, each
    device's highest contiguous stored sequence number, and a real agent drops from its spool exactly what the
    store holds, no sooner than the store has it."""
    device = "acked-1"
    agent = AgentProcess(device, tmp_path / device, broker=mosquitto.url, trust=root_pub, telemetry_interval=0.2)
    with control_plane(mosquitto.url, tmp_path, engine=False) as plane:
        agent.start()
        try:
            wait_until("10 reports stored", lambda: plane.store.telemetry_count(device) >= 10, timeout=60)
            acked: list[StoredUpTo] = []
            host.subscribe(topics.stored(device), lambda t, p, r: acked.append(decode(StoredUpTo, p)))
            wait_until("the retained acknowledgement", lambda: acked, timeout=10)
            spool = tmp_path / device / "outbox.sqlite"

            def spool_counter(name: str) -> int:
                with sqlite3.connect(f"file:{spool}?mode=ro", uri=True) as db:
                    row = db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
                return int(row[0]) if row else 0

            wait_until("the agent heard it", lambda: spool_counter("stored_up_to") >= 10, timeout=30)
        finally:
            agent.stop()
        up_to = spool_counter("stored_up_to")
        stored = {e.seq for e in plane.store.events(device_id=device, limit=10_000)}
        stored |= {p.seq for p in plane.store.telemetry(device, 0.0)}
        assert set(range(1, up_to + 1)) <= stored, "the device dropped only what the store holds"
        assert 1 <= acked[0].up_to <= max(n for n in stored if n is not None)
        assert plane.ingestor is not None and plane.ingestor.stats.counts["stored_acks"] >= 1


def test_repeats_and_bad_messages_are_counted_and_ingestion_goes_on(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, topics: Topics
) -> None:
    with control_plane(mosquitto.url, tmp_path, engine=False) as plane:
        assert plane.ingestor is not None
        store, counts = plane.store, plane.ingestor.stats.counts
        status = DeviceStatus(device_id="known-1", online=True, state="idle")
        host.publish(topics.status("known-1"), status.encode(), retain=True, wait=5)
        wait_until("the status", lambda: store.device("known-1"))

        report = _report("known-1", 1)
        for _ in range(3):  # an agent re-sending what it thinks was lost
            host.publish(topics.telemetry("known-1"), report, wait=5)
        event = Event(device_id="known-1", kind="committed", seq=2).encode()
        host.publish(topics.events("known-1"), event, wait=5)
        host.publish(topics.events("known-1"), event, wait=5)
        host.publish(topics.telemetry("known-1"), b"\xff not json", wait=5)
        host.publish(topics.telemetry("known-1"), b'{"schema_version": 1, "device_id": "known-1"}', wait=5)
        host.publish(topics.status("junk-1"), b"{broken", retain=True, wait=5)
        host.publish(topics.telemetry("stranger"), _report("stranger", 1), wait=5)
        host.publish(topics.telemetry("known-1"), _report("someone-else", 5), wait=5)
        host.publish(topics.telemetry("known-1"), _report("known-1", 3), wait=5)  # still ingesting afterwards

        wait_until("the last report", lambda: store.telemetry_count("known-1") == 2)
        assert plane.ingestor.drain()
        assert counts["duplicates"] == 3 and counts["telemetry"] == 2 and counts["events"] == 1, counts
        assert counts["malformed"] == 3 and counts["unknown_device"] == 1 and counts["mismatched"] == 1
        assert store.device("junk-1") is None and store.device("stranger") is None
        wait_until("the counters in the store", lambda: store.counters().get("ingest.malformed") == 3, timeout=10)
        host.publish(topics.status("junk-1"), b"", retain=True, wait=5)


def test_a_message_the_store_refuses_is_rejected_loudly_and_blocks_nothing(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, topics: Topics
) -> None:
    """A valid message the store cannot hold fails every write of its batch. Ingestion writes that batch message by
    message, rejects the one the store refuses (counted and logged with its payload) and stores the others; later
    reports flow as before. Ingest's bounds now refuse every number a real store could not hold (a sequence number
    past 2^64 once was the poison), so the store's refusal of one report is the fault injected here."""
    with control_plane(mosquitto.url, tmp_path, engine=False) as plane:
        assert plane.ingestor is not None
        store, counts = plane.store, plane.ingestor.stats.counts
        real_add = store.add_telemetry

        def refusing_add(reports: list[Telemetry], received_at: float) -> int:
            if any(r.seq == POISON for r in reports):
                raise OverflowError("Python int too large to convert to SQLite INTEGER")
            return real_add(reports, received_at)

        store.add_telemetry = refusing_add  # type: ignore[method-assign]
        host.publish(topics.status("poison-1"), DeviceStatus(device_id="poison-1", online=True, state="idle").encode(),
                     retain=True, wait=5)  # fmt: skip
        wait_until("the status", lambda: store.device("poison-1"))
        host.publish(topics.telemetry("poison-1"), _report("poison-1", POISON), wait=5)
        for seq in (1, 2):
            host.publish(topics.telemetry("poison-1"), _report("poison-1", seq), wait=5)
        wait_until("the rejection", lambda: counts["rejected"] == 1)
        host.publish(topics.telemetry("poison-1"), _report("poison-1", 3), wait=5)
        wait_until("the reports around it", lambda: store.telemetry_count("poison-1") == 3)
        assert {p.seq for p in store.telemetry("poison-1", 0.0)} == {1, 2, 3}
        wait_until("the counter in the store", lambda: store.counters().get("ingest.rejected") == 1, timeout=10)
        host.publish(topics.status("poison-1"), b"", retain=True, wait=5)


def test_telemetry_published_while_the_control_plane_is_down_is_delivered_when_it_returns(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, topics: Topics
) -> None:
    host.publish(topics.status("away-1"), DeviceStatus(device_id="away-1", online=True, state="idle").encode(),
                 retain=True, wait=5)  # fmt: skip
    with control_plane(mosquitto.url, tmp_path, retire=False, engine=False, instance="persistent") as plane:
        wait_until("the status", lambda: plane.store.device("away-1"))
    # The control plane's persistent session keeps its subscriptions: the broker queues for it meanwhile.
    for seq in range(1, 11):
        host.publish(topics.telemetry("away-1"), _report("away-1", seq), wait=5)
    with control_plane(mosquitto.url, tmp_path, engine=False, instance="persistent") as plane:
        wait_until("the queued reports", lambda: plane.store.telemetry_count("away-1") == 10, timeout=15)
    host.publish(topics.status("away-1"), b"", retain=True, wait=5)


def test_on_a_broker_without_shared_subscriptions_ingestion_falls_back_to_plain_ones(
    embedded_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    with (
        control_plane(embedded_broker.url, tmp_path, engine=False) as plane,
        sim_fleet(embedded_broker.url, ["amqtt-1", "amqtt-2"], telemetry_interval=0.2) as fleet,
    ):
        assert plane.ingestor is not None and plane.ingestor.share_group is None, "amqtt ignores $share"
        wait_until("telemetry", lambda: plane.store.telemetry_count() >= 10)
        fleet.stop()
        assert plane.ingestor.drain()
        assert plane.store.telemetry_count() == fleet.stats.telemetry_acked


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_store_that_fails_for_10_s_loses_no_acknowledged_report(
    mosquitto: MosquittoBroker, tmp_path: Path, protocol: str
) -> None:
    """A real fault: another process holds the SQLite write lock for 10 s, so every write of the control plane
    fails (SQLITE_BUSY after its 0.5 s busy timeout). Ingestion keeps the batch, acknowledges nothing and retries;
    once the lock is gone every report the broker acknowledged to a device is in the store, counted by each
    device's sequence numbers."""
    devices = [f"fault-{i}" for i in range(5)]
    path = tmp_path / "control.sqlite"
    store = Store(SqliteDatabase(path, f"sqlite://{path}", busy_timeout_s=0.5))
    with (
        control_plane(mosquitto.url, tmp_path, store=store, engine=False, protocol=protocol) as plane,
        sim_fleet(mosquitto.url, devices, telemetry_interval=0.1) as fleet,
    ):
        assert plane.ingestor is not None
        wait_until("telemetry flowing", lambda: store.telemetry_count() >= 20)
        blocker = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # the write lock, held by someone else
        try:
            stored_at_fault = store.telemetry_count()
            time.sleep(10.0)  # the fault's length is the point of the test
            assert store.telemetry_count() == stored_at_fault, "nothing can be written meanwhile"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        wait_until("the backlog", lambda: store.telemetry_count() >= stored_at_fault + 5 * 60, timeout=60)
        fleet.stop()
        assert plane.ingestor.drain(30)
        acked = {d: device.acked_telemetry for d, device in fleet.devices.items()}  # its loop has stopped
        lost = {d: sorted(set(seqs) - {p.seq for p in store.telemetry(d, 0.0)}) for d, seqs in acked.items()}
        sent = sum(len(s) for s in acked.values())
        counts = plane.ingestor.stats.counts
        print(f"MQTT {protocol}: {sent} reports acknowledged, {counts['store_retries']} failed writes retried, "
              f"lost {sum(len(v) for v in lost.values())}")  # fmt: skip
        assert counts["store_retries"] >= 5, "the fault really hit the writes"
        assert sent >= 5 * 100 and all(not v for v in lost.values()), lost


@pytest.mark.slow
def test_a_control_plane_stopped_while_its_store_fails_leaves_the_reports_to_the_broker(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    """Stopped with its store still failing, ingestion gives up its batch unacknowledged: the broker keeps it (and
    everything sent meanwhile) in the instance's persistent session and hands it to the next process under the
    same instance name. 0 acknowledged reports lost."""
    devices = [f"handover-{i}" for i in range(3)]
    path = tmp_path / "control.sqlite"
    store = Store(SqliteDatabase(path, f"sqlite://{path}", busy_timeout_s=0.5))
    options = {"engine": False, "instance": "handover", "protocol": "5"}
    first = ControlPlane(control_config(mosquitto.url, tmp_path, **options), store=store).start()
    try:  # subscribed before the devices report: nothing is published to no one
        with sim_fleet(mosquitto.url, devices, telemetry_interval=0.1) as fleet:
            assert first.ingestor is not None
            wait_until("telemetry flowing", lambda: store.telemetry_count() >= 10)
            blocker = sqlite3.connect(path, timeout=5.0, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            wait_until("a failed write", lambda: first.ingestor.stats.counts["store_retries"] >= 2)  # type: ignore[union-attr]
            first.stop(retire=False)
            counts = first.ingestor.stats.counts
            assert counts["unacknowledged_at_stop"] > 0, counts
            blocker.execute("ROLLBACK")
            blocker.close()
            with control_plane(mosquitto.url, tmp_path, **options) as second:
                time.sleep(1.0)  # the devices keep reporting to the new process a moment
                fleet.stop()
                acked = {d: device.acked_telemetry for d, device in fleet.devices.items()}

                def lost() -> dict[str, list[int]]:
                    stored = {d: {p.seq for p in second.store.telemetry(d, 0.0)} for d in acked}
                    return {d: sorted(set(s) - stored[d]) for d, s in acked.items() if set(s) - stored[d]}

                wait_until("every acknowledged report", lambda: not lost() or None, timeout=30)
                assert sum(len(s) for s in acked.values()) >= 3 * 20
    finally:
        first.stop()


def test_the_retained_janitors_own_clears_are_not_malformed_messages(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    """Clearing a retained message is an empty retained PUBLISH, which the broker also delivers to subscribers
    (MQTT 3.1.1 §3.3.1.3): ingestion counts it as a clear, never as a malformed report."""
    from edgefleet.control.broker.janitor import RetainedJanitor

    with control_plane(mosquitto.url, tmp_path, engine=False) as plane:
        assert plane.ingestor is not None
        counts = plane.ingestor.stats.counts
        host.publish(topics.status("leaver-1"), DeviceStatus(device_id="leaver-1", online=True, state="idle").encode(),
                     retain=True, wait=5)  # fmt: skip
        wait_until("the status", lambda: plane.store.device("leaver-1"))
        host.publish(topics.telemetry("leaver-1"), _report("leaver-1", 1), retain=True, wait=5)
        host.publish(topics.events("leaver-1"), Event(device_id="leaver-1", kind="committed", seq=2).encode(),
                     retain=True, wait=5)  # fmt: skip
        wait_until("both reports", lambda: counts["telemetry"] == 1 and counts["events"] == 1)
        cleared = RetainedJanitor(host, topics).sweep()
        assert sorted(cleared) == sorted([topics.telemetry("leaver-1"), topics.events("leaver-1")])
        wait_until("the clears", lambda: counts["retained_cleared"] == 2)
        assert plane.ingestor.drain()
        assert counts["malformed"] == 0, counts
        assert "malformed" not in caplog.text
        host.publish(topics.status("leaver-1"), b"", retain=True, wait=5)
