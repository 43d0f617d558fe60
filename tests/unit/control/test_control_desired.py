"""Desired state under a stalled broker: what the broker has not acknowledged stays in flight and is not published
again by the next sync (no pile-up of copies at scale); once the broker acknowledges, it is recorded."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.desired import sync as desired
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.store import Deployment, GroupDef, Store, open_store
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.servers.brokers import MosquittoBroker

DEVICES = [f"dz-{i}" for i in range(20)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite://{tmp_path}/s.sqlite")
    s.upsert_statuses([DeviceStatus(device_id=d, online=True, state="idle", profile="p", ts=1.0) for d in DEVICES], 1.0)
    s.put_group(GroupDef("all", tuple(DEVICES)))
    yield s
    s.close()


def test_a_stalled_broker_gets_each_desired_state_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(desired, "ACK_TIMEOUT_S", 1.0)
    with MosquittoBroker() as broker:
        conn = Connection(broker.url, "desired-test").start()
        sent: list[str] = []
        real_publish = conn.publish_latest  # how desired documents go out (a retained last value)

        def counting_publish(topic: str, payload: bytes, **kw: object) -> object:
            sent.append(topic)
            return real_publish(topic, payload, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(conn, "publish_latest", counting_publish)
        publisher = DesiredPublisher(conn, Topics(), store)
        store.put_deployment(Deployment("group", "all", "p", "b1", "m", "1", updated_at=1.0))
        assert broker._process is not None
        os.kill(broker._process.pid, signal.SIGSTOP)  # a broker that stops answering (overload, a long GC)
        try:
            with pytest.raises(BrokerError, match="20 device"):
                publisher.sync()
            with pytest.raises(BrokerError, match="20 device"):
                publisher.sync()
            assert len(sent) == len(DEVICES), "the second sync published nothing again"
            assert store.published() == {}
        finally:
            os.kill(broker._process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while True:
            try:
                report = publisher.sync()
                break
            except BrokerError:
                assert time.monotonic() < deadline, "the broker never acknowledged"
        assert sorted(report.published) == sorted(DEVICES) and len(sent) == len(DEVICES)
        assert {p.bundle_id for p in store.published().values()} == {"b1"} and len(store.published()) == 20
        conn.stop()
