"""The benchmark farm on the SHIPPED secure Mosquitto configuration: a device with only its base rights may read the
candidate bundles while it measures them, through a role of their own, and not before nor after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.farm.rights import FARM_ROLE_PREFIX
from edgefleet.control.farm.service import FleetFarm
from edgefleet.control.rights.dynsec import device_role
from edgefleet.control.rights.sync import DynsecClient, DynsecRights, NoBrokerRights, open_rights
from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.servers.secure_broker import SecureBroker, make_pki

DEVICE = "bench-sec-1"
TOPICS = Topics()


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    pki = make_pki(tmp_path / "pki", [DEVICE])
    with SecureBroker(pki, {DEVICE: []}) as broker:  # base rights only: no bundle, no group
        yield broker


def _roles_of(client: DynsecClient, device: str) -> list[str]:
    (reply,) = client.check([{"command": "getClient", "username": device}])
    return [r["rolename"] for r in reply["data"]["client"]["roles"]]


def _farm_roles(client: DynsecClient) -> list[str]:
    (reply,) = client.check([{"command": "listRoles"}])
    roles: list[Any] = reply["data"]["roles"]
    return [r if isinstance(r, str) else r["rolename"] for r in roles if str(r).find(FARM_ROLE_PREFIX) >= 0]


def _bundle_acls(client: DynsecClient, device: str) -> list[str]:
    (reply,) = client.check([{"command": "getRole", "rolename": device_role(device)}])
    return [a["topic"] for a in reply["data"]["role"]["acls"] if "/bundles/" in a["topic"]]


@pytest.mark.slow
def test_devices_may_read_the_candidates_only_while_they_measure_them(
    secure: SecureBroker, tmp_path: Path, keys: tuple[Path, Path], signing_key: SigningKey,
    demo_bundles: dict[str, Path], attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    candidate = derive_bundle(
        demo_bundles["intel-x86-vnni"], tmp_path, signing_key, TrustedKeys.load([keys[1]]), benchmark_only=True
    )
    host = secure.connect(HOST_IDENTITY)
    watcher = FleetWatcher(host, TOPICS)
    tls = secure.pki.tls(DEVICE)
    agent = AgentProcess(
        DEVICE, tmp_path / DEVICE, broker=secure.url, trust=keys[0].parent / "root.pub",
        extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
    ).start()  # fmt: skip
    try:
        watcher.wait_for(f"{DEVICE} online", lambda: (s := watcher.status.get(DEVICE)) is not None and s.online, 60)
        rights = open_rights(host, TOPICS, "dynsec")
        assert isinstance(rights, DynsecRights)
        client = rights.client  # one client per connection: it takes the plugin's responses
        assert _roles_of(client, DEVICE) == [device_role(DEVICE)] and not _bundle_acls(client, DEVICE)

        # One connection per certificate identity: the farm reads the statuses the watcher follows on it.
        options: dict[str, Any] = {"calls": 5, "rounds": 1, "statuses": lambda: dict(watcher.status)}
        # Without the grant (a farm that does not manage rights), its base rights do not let it read the candidate.
        ungranted = FleetFarm(host, TOPICS, DEVICE, rights=NoBrokerRights("test"), timeout_s=40, **options)
        without = ungranted.measure("intel-x86-vnni", [candidate], lambda _msg: None)
        fetched = [f for r in without.results.values() for f in r.candidates if f.ok]
        assert not attack_ledger.record(
            "a device reads a candidate bundle it was not granted",
            bool(fetched),
            f"answers: {[f.error for r in without.results.values() for f in r.candidates]}; silent: {without.silent}",
        )

        farm = FleetFarm(host, TOPICS, DEVICE, rights=rights, timeout_s=120, **options)
        answer = farm.measure("intel-x86-vnni", [candidate], lambda _msg: None)

        # It could fetch and measure the candidate: the farm's role let it read the candidate's topics.
        assert answer.silent == [] and DEVICE in answer.results, answer.notes
        (figures,) = answer.results[DEVICE].candidates
        assert figures.ok and figures.golden_passed, figures.error
        # Afterwards: the role is gone, the device holds only its own role, whose rights were never touched.
        assert _roles_of(client, DEVICE) == [device_role(DEVICE)]
        assert _farm_roles(client) == []
        assert not _bundle_acls(client, DEVICE)
    finally:
        agent.stop()
        host.stop()
