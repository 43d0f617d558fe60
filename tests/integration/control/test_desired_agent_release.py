"""An agent release the store names for a device (`agent_release_targets`, what an agent-release wave sets) reaches
the device in its signed desired state: the control plane signs it into every slot's document of that device, signs
again when the store's release changes or is withdrawn, and leaves the documents of other devices alone."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefleet.agent.install.desired import DesiredState
from edgefleet.agent.install.store import Store as DeviceStore
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.store import AgentReleaseTarget, Deployment, Store, open_store
from edgefleet.core.messages import AgentRelease, DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import TrustedKeys

from support.servers.brokers import MosquittoBroker

CANARY, OTHER = "ar-1", "ar-2"
RELEASE = AgentReleaseTarget(CANARY, "edgefleet-agent-0.2.0-abc123", "0.2.0", source="rollout:r1", updated_at=2.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite://{tmp_path}/s.sqlite")
    for device in (CANARY, OTHER):
        opened.upsert_statuses([DeviceStatus(device_id=device, online=True, state="idle", profile="p", ts=1.0)], 1.0)
        opened.put_deployment(Deployment("device", device, "p", "m-1", "m", "1", updated_at=1.0))
        opened.put_deployment(Deployment("device", device, "p", "n-1", "n", "1", updated_at=1.0, slot="vision"))
    yield opened
    opened.close()


class _Device:
    """The device's own desired-state path, fed from its retained desired topics (both slots)."""

    def __init__(self, broker: MosquittoBroker, keys: keyring.HostKeys, root: Path) -> None:
        store = DeviceStore(root)
        self.state = DesiredState(CANARY, [], DeviceTrust(TrustedKeys.load([keys.root_public()]), store), store)
        self.inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.conn = Connection(broker.url, CANARY).start()
        for slot in ("default", "vision"):
            self.conn.subscribe(Topics().device_desired(CANARY, slot), self._taker(slot), qos=1)

    def _taker(self, slot: str) -> Callable[[str, bytes, bool], None]:
        return lambda _topic, payload, _retained: self.inbox.put((slot, payload))

    def next_releases(self) -> dict[str, AgentRelease | None]:
        """Take one document per slot from the broker, as the agent does; the release each slot's names."""
        for _ in range(2):
            slot, payload = self.inbox.get(timeout=30)
            self.state.on_message("device", None, slot, payload)
        found: dict[str, AgentRelease | None] = {}
        for slot in ("default", "vision"):
            doc = self.state.effective(slot)
            assert doc is not None, f"slot {slot} has a document in force"
            found[slot] = doc.agent_release
        return found


def test_the_stores_agent_release_is_signed_into_every_slot_of_the_device_and_follows_every_change(
    store: Store, host_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    with MosquittoBroker() as broker:
        host = Connection(broker.url, "ar-host").start()
        device = _Device(broker, host_keys, tmp_path / "device")
        try:
            publisher = DesiredPublisher(host, Topics(), store)
            first = sorted(publisher.sync().published)
            assert first == sorted([CANARY, f"{CANARY}/vision", OTHER, f"{OTHER}/vision"])
            assert device.next_releases() == {"default": None, "vision": None}

            store.put_agent_release(RELEASE)
            assert store.agent_releases() == {CANARY: RELEASE}
            assert sorted(publisher.sync().published) == [CANARY, f"{CANARY}/vision"], "only the canary's documents"
            wanted = AgentRelease(release_id=RELEASE.release_id, version="0.2.0")
            assert device.next_releases() == {"default": wanted, "vision": wanted}
            assert publisher.sync().published == [], "nothing changed: nothing signed again"

            assert store.delete_agent_release(CANARY) == 1
            assert sorted(publisher.sync().published) == [CANARY, f"{CANARY}/vision"]
            assert device.next_releases() == {"default": None, "vision": None}, "the wave withdrew it"
        finally:
            device.conn.stop()
            host.stop()
