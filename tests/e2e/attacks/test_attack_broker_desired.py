"""Desired state on the SHIPPED secure Mosquitto configuration, with real agent processes: `edgefleet deploy`
grants the devices their bundle rights on the managed broker, and clearing a desired topic needs the ops key.

The attacker holds a host identity (full publish rights under the prefix, like a stolen operator certificate) and
no ops key. Clearing a retained desired topic (an empty message) is unsigned: a device refuses it, keeps the
document in force, its bundle and its floor, also after a restart when the broker no longer holds the document.
Only a signed "no desired state" document clears.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import clear_desired, publish_desired
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.control.rights.deploy import grant_deploy
from edgefleet.control.rights.sync import DynsecClient
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.messages import Desired, Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.common import bundle_id_of, cli_deploy, granted_bundles
from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki
from support.slots import slot_of

PROFILE = "intel-x86-vnni"
TOPICS = Topics()
DEVICES = {"dc-1": ["lab"], "dc-2": ["lab"]}
INTRUDER = "edgefleet-intruder"  # a host identity without the ops key
SHORT_TTL_S = 60.0  # dc-1's own document expires during the test, so its status names the document in force


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    hosts = (HOST_IDENTITY, CLI_IDENTITY, INTRUDER)
    pki = make_pki(tmp_path / "pki", list(DEVICES), hosts=hosts)
    with SecureBroker(pki, DEVICES, host_users=hosts) as broker:  # base rights and group lab: no bundle
        yield broker


def _agent(broker: SecureBroker, device: str, tmp_path: Path, root_pub: Path) -> AgentProcess:
    tls = broker.pki.tls(device)
    return AgentProcess(
        device, tmp_path / device, broker=broker.url, trust=root_pub, profile=PROFILE, groups=("lab",),
        extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
    ).start()  # fmt: skip


def _refused(watcher: FleetWatcher, device: str, topic: str, after: int) -> Event:
    def check() -> Event | None:
        for event in watcher.events[after:]:
            if event.device_id == device and event.kind == "refused" and topic in event.detail:
                return event
        return None

    return watcher.wait_for(f"{device} refusing the clear of {topic}", check, 60)


@pytest.mark.slow
def test_deploy_grants_rights_and_an_unsigned_clear_changes_nothing(
    secure: SecureBroker, tmp_path: Path, root_pub: Path, signing_key: SigningKey, keys: tuple[Path, Path],
    host_keys: HostKeys, demo_bundles: dict[str, Path], attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    v1 = demo_bundles[PROFILE]
    v2, v3, v4 = (derive_bundle(v1, tmp_path, signing_key, trusted, model_version=v) for v in ("2", "3", "4"))
    operator = secure.connect(HOST_IDENTITY)
    client = DynsecClient(operator)
    watcher = FleetWatcher(operator, TOPICS)
    agents = {d: _agent(secure, d, tmp_path, root_pub) for d in DEVICES}
    try:
        # `edgefleet deploy --group lab`: the broker's members of lab (their roles read lab's desired) are granted.
        report = cli_deploy(secure, v1, "--group", "lab")
        assert report["rights"] == {"managed": True, "reason": "Mosquitto dynamic-security plugin",
                                    "devices": ["dc-1", "dc-2"], "unknown": []}  # fmt: skip
        for device in DEVICES:
            watcher.serving(device, bundle_id_of(v1), timeout=120)
        # `--device dc-1`: dc-1 may read v2, and keeps v1, which lab's retained document (that it also obeys)
        # names; dc-2 keeps v1's.
        report = cli_deploy(secure, v2, "--device", "dc-1")
        assert report["rights"]["devices"] == ["dc-1"]  # type: ignore[index]
        watcher.serving("dc-1", bundle_id_of(v2), timeout=120)
        assert granted_bundles(client, "dc-1") == {bundle_id_of(v1), bundle_id_of(v2)}
        assert granted_bundles(client, "dc-2") == {bundle_id_of(v1)}

        # dc-1's own document names v3 (short-lived, see SHORT_TTL_S); the group moves on to v4, which dc-2 takes
        # and dc-1 does not (its own document wins).
        v3_id = _publish_and_grant(operator, v3, "dc-1")
        manifest = parse_manifest(read_signed_manifest(v3).manifest_json)
        own = Desired(bundle_id=v3_id, model_name=manifest.model_name, model_version="3", profile=PROFILE)
        publish_desired(operator, TOPICS, host_keys, own, device="dc-1", ttl_s=SHORT_TTL_S, wait=10)
        watcher.serving("dc-1", v3_id, timeout=120)
        cli_deploy(secure, v4, "--group", "lab")
        watcher.serving("dc-2", bundle_id_of(v4), timeout=120)

        # The attack: the intruder clears dc-1's and the group's retained documents.
        intruder = secure.connect(INTRUDER)
        try:
            for topic in (TOPICS.device_desired("dc-1", "default"), TOPICS.group_desired("lab", "default")):
                marker = len(watcher.events)
                intruder.publish(topic, b"", qos=1, retain=True, wait=10)
                event = _refused(watcher, "dc-1", topic, marker)
                status = watcher.status["dc-1"]
                serves = slot_of(status).active_bundle
                changed = serves != v3_id or not status.online
                assert not attack_ledger.record(
                    f"clearing a desired topic with an empty retained message ({topic.split('/')[-4]} topic)",
                    changed,
                    f"dc-1 refused it ({event.detail.split(': ', 1)[-1][:80]}…) and serves {serves}",
                )
        finally:
            intruder.stop()

        # After a restart the broker holds neither document; dc-1 still has its own in force (from disk): once
        # it expires, its status names it. Had the clear worked, the group's v4 would be in force and installed.
        agents["dc-1"].stop()
        restarted_at = time.time()
        agents["dc-1"].start()

        def own_document_in_force() -> str | None:
            status = watcher.status.get("dc-1")
            fresh = status is not None and status.online and status.ts > restarted_at
            stale = status.desired_stale if status is not None and fresh else None
            return stale if stale and "device:dc-1" in stale else None

        stale = watcher.wait_for("dc-1 reporting its own (cleared, kept) document", own_document_in_force,
                                 SHORT_TTL_S + 90)  # fmt: skip
        status = watcher.status["dc-1"]
        installs = [e for e in watcher.events if e.device_id == "dc-1" and e.bundle_id == bundle_id_of(v4)]
        assert not attack_ledger.record(
            "clearing a device's desired topic, then the device restarts",
            slot_of(status).active_bundle != v3_id or bool(installs),
            f"after the restart dc-1 serves {slot_of(status).active_bundle}, {len(installs)} events on the group's v4; "
            f"in force: {stale[:70]}…",
        )
        active_model = slot_of(status).active_model
        assert active_model is not None and active_model.endswith("@3")

        # Only a signed clear clears: dc-1 forgets its own document, and the group's (kept across the unsigned
        # group clear) applies: v4.
        marker = len(watcher.events)
        clear_desired(operator, TOPICS, host_keys, device="dc-1", wait=10)
        watcher.serving("dc-1", bundle_id_of(v4), timeout=120)
        assert not [e for e in watcher.events[marker:] if e.device_id == "dc-1" and e.kind == "refused"]
    finally:
        for agent in agents.values():
            agent.stop()
        operator.stop()


def _publish_and_grant(operator: Connection, bundle: Path, device: str) -> str:
    """Publish `bundle` and grant `device` its rights, as `deploy` does, without a desired document."""
    manifest, _ = publish_bundle(operator, TOPICS, bundle)
    grant_deploy(operator, TOPICS, manifest.bundle_id, devices=[device])
    return manifest.bundle_id
