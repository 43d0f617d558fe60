"""A paid link's byte-rate cap, set in the host registry (`devices enroll --max-bytes-per-s`), reaches the device in
its signed desired state: the control plane signs the cap into the device's document, signs again when the
registry's cap changes or is lifted, and the device's link pacer takes what the document in force says."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.agent.install.desired import DesiredState
from edgefleet.agent.install.store import Store as DeviceStore
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.agent.transfer.link import LinkPacer
from edgefleet.cli.main import main as cli
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.fleet.registry import link_cap
from edgefleet.control.store import Deployment, Store, open_store
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import TrustedKeys

from support.servers.brokers import MosquittoBroker

DEVICE = "cap-1"


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite://{tmp_path}/s.sqlite"
    store = open_store(url)
    store.upsert_statuses([DeviceStatus(device_id=DEVICE, online=True, state="idle", profile="p", ts=1.0)], 1.0)
    store.put_deployment(Deployment("device", DEVICE, "p", "m-1", "m", "1", updated_at=1.0))
    store.close()
    yield url


def _enroll(store_url: str, *args: str) -> int:
    return cli(["devices", "enroll", DEVICE, "--profile", "p", "--store", store_url, *args])


class _Device:
    """The device's own desired-state path and link pacer, fed from its retained desired topic."""

    def __init__(self, broker: MosquittoBroker, keys: keyring.HostKeys, root: Path) -> None:
        store = DeviceStore(root)
        trust = DeviceTrust(TrustedKeys.load([keys.root_public()]), store)
        self.state = DesiredState(DEVICE, [], trust, store)
        self.link = LinkPacer(config_cap=1_000_000)  # the agent's own configuration: 1 MB/s
        self.inbox: queue.Queue[bytes] = queue.Queue()
        self.conn = Connection(broker.url, DEVICE).start()
        self.conn.subscribe(
            Topics().device_desired(DEVICE, "default"), lambda _t, payload, _retained: self.inbox.put(payload), qos=1
        )

    def next_cap(self) -> int | None:
        """Take the next document from the broker, as the agent does, and return the link's cap after it."""
        self.state.on_message("device", None, "default", self.inbox.get(timeout=30))
        self.link.apply_desired(self.state.effective())
        return self.link.cap


def test_the_registry_cap_is_signed_into_desired_state_and_follows_every_change(
    store_url: str, host_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    assert _enroll(store_url, "--max-bytes-per-s", "250000") == 0
    with MosquittoBroker() as broker:
        host = Connection(broker.url, "cap-host").start()
        store: Store = open_store(store_url)
        device = _Device(broker, host_keys, tmp_path / "device")
        try:
            publisher = DesiredPublisher(host, Topics(), store)
            assert publisher.sync().published == [DEVICE]
            assert device.next_cap() == 250_000, "the registry's cap, below the agent's own 1 MB/s"

            assert publisher.sync().published == [], "nothing changed: nothing signed again"
            assert _enroll(store_url, "--max-bytes-per-s", "2000000") == 0
            assert publisher.sync().published == [DEVICE]
            assert device.next_cap() == 1_000_000, "a registry cap above the agent's own: the smaller wins"

            assert _enroll(store_url, "--max-bytes-per-s", "0") == 0
            assert publisher.sync().published == [DEVICE]
            assert device.next_cap() == 1_000_000, "lifted: only the agent's own cap is left"
            effective = device.state.effective()
            assert effective is not None and effective.max_bytes_per_s is None and effective.bundle_id == "m-1"
        finally:
            device.conn.stop()
            host.stop()
            store.close()


def test_a_negative_cap_is_refused_and_the_registry_keeps_what_it_had(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _enroll(store_url, "--max-bytes-per-s", "300000") == 0
    assert _enroll(store_url, "--max-bytes-per-s", "-5") == 1
    assert "--max-bytes-per-s takes a byte rate" in capsys.readouterr().err
    store = open_store(store_url)
    try:
        record = store.device(DEVICE)
        assert record is not None and link_cap(record) == 300_000
    finally:
        store.close()
