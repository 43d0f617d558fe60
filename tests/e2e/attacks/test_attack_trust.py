"""Signature-level attacks on real agent processes over a real Mosquitto, each counted in the attack ledger.

The attacker has broker publish rights (the session broker is anonymous) and no signing key: they can replay,
reorder and overwrite any retained message, and sign with keys of their own. Every attack must fail; the device
must say why (a `refused` event: nothing changed on the device) and keep serving what it had.
"""

from __future__ import annotations

import json
import queue
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import device_target, publish_desired, sign_desired
from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import Desired, Event, SignedDesired, Transfer, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import describe_transfer, iter_blocks, sign_offer
from edgefleet.core.trust.keyset import sign_payload
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, attacker_keys, deploy_to, derive_bundle
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]
REFUSALS = ("refused",)


def retained(conn: Connection, topic: str, timeout: float = 10.0) -> bytes:
    """What the broker holds retained on `topic` (what an attacker with read rights captures)."""
    inbox: queue.Queue[bytes] = queue.Queue()
    conn.subscribe(topic, lambda _t, payload, _r: inbox.put(payload))
    try:
        return inbox.get(timeout=timeout)
    finally:
        conn.unsubscribe(topic)


def refusal(watcher: FleetWatcher, device: str, text: str, after: int = 0, timeout: float = 45.0) -> Event:
    def check() -> Event | None:
        for event in watcher.events[after:]:
            if event.device_id == device and event.kind in REFUSALS and text in event.detail:
                return event
        return None

    return watcher.wait_for(f"{device} refusing: {text}", check, timeout)


def manifest_of(bundle: Path) -> Manifest:
    return parse_manifest(read_signed_manifest(bundle).manifest_json)


def test_a_replayed_desired_document_is_refused_before_and_after_a_restart(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    v1 = demo_bundles["intel-x86-vnni"]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    agent = start_agent("atk-replay")
    v1_id = deploy_to(host, topics, v1, devices=("atk-replay",))
    watcher.serving("atk-replay", v1_id)
    captured = retained(host, topics.device_desired("atk-replay", "default"))
    v2_id = deploy_to(host, topics, v2, devices=("atk-replay",))
    watcher.serving("atk-replay", v2_id)

    host.publish(topics.device_desired("atk-replay", "default"), captured, qos=1, retain=True, wait=5)
    event = refusal(watcher, "atk-replay", "replayed desired document")
    time.sleep(1.0)
    succeeded = slot_of(watcher.status["atk-replay"]).active_bundle != v2_id
    assert not attack_ledger.record("replay of an old desired document", succeeded, event.detail)

    # The highest counter persists: after a restart the broker hands the device the replayed document again.
    marker = len(watcher.events)
    agent.stop()
    agent.start()
    event = refusal(watcher, "atk-replay", "replayed desired document", after=marker)
    watcher.serving("atk-replay", v2_id)
    succeeded = slot_of(watcher.status["atk-replay"]).active_bundle != v2_id
    assert not attack_ledger.record("replay of an old desired document after a device restart", succeeded,
                                    event.detail)  # fmt: skip


def test_a_forged_rollback_is_refused_and_only_a_signed_downgrade_is_obeyed(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, host_keys: HostKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    v1 = demo_bundles["intel-x86-vnni"]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    agent = start_agent("atk-rollback")
    v1_id = deploy_to(host, topics, v1, devices=("atk-rollback",))  # v1's offer and blocks stay retained
    watcher.serving("atk-rollback", v1_id)
    v2_id = deploy_to(host, topics, v2, devices=("atk-rollback",))
    watcher.serving("atk-rollback", v2_id)
    old = manifest_of(v1)
    rollback = Desired(bundle_id=old.bundle_id, model_name=old.model_name, model_version=old.model_version,
                       profile=old.profile, rollback=True)  # fmt: skip
    topic = topics.device_desired("atk-rollback", "default")

    attempts: dict[str, tuple[bytes, str]] = {
        "forged rollback: an unsigned document with rollback=true": (
            rollback.encode(), "not a signed desired document"),
        "forged rollback: signed by the attacker's own key": (
            sign_desired(attacker_keys(tmp_path / "mallory", host_keys), rollback, device_target("atk-rollback"))
            .encode(), "not signed by a trusted operations key"),
    }  # fmt: skip
    genuine = decode(SignedDesired, retained(host, topic))
    tampered = json.loads(genuine.desired.payload)
    tampered.update(bundle_id=old.bundle_id, model_version=old.model_version, allow_downgrade_to=old.bundle_id,
                    counter=tampered["counter"] + 1)  # fmt: skip
    attempts["forged rollback: a genuine document edited to allow the downgrade"] = (
        genuine.model_copy(update={"desired": genuine.desired.model_copy(update={"payload": json.dumps(tampered)})})
        .encode(), "does not verify")  # fmt: skip
    for name, (payload, reason) in attempts.items():
        marker = len(watcher.events)
        host.publish(topic, payload, qos=1, retain=True, wait=5)
        event = refusal(watcher, "atk-rollback", reason, after=marker)
        succeeded = slot_of(watcher.status["atk-rollback"]).active_bundle != v2_id
        assert not attack_ledger.record(name, succeeded, event.detail)

    # Even an ops-signed document does not downgrade on the unsigned `rollback` flag alone.
    marker = len(watcher.events)
    flag_only = rollback.model_copy(
        update={"target": device_target("atk-rollback"), "counter": host_keys.next_counter(),
                "expires_at": time.time() + 3600, "allow_downgrade_to": None}
    )  # fmt: skip
    signed = SignedDesired(desired=sign_payload("desired", flag_only.model_dump_json(), host_keys.ops_key()))
    host.publish(topic, signed.encode(), qos=1, retain=True, wait=5)
    event = refusal(watcher, "atk-rollback", "not newer than 2", after=marker)
    succeeded = slot_of(watcher.status["atk-rollback"]).active_bundle != v2_id
    assert not attack_ledger.record("rollback flag without a signed allowance", succeeded, event.detail)

    # The operator's explicit, signed downgrade names the exact bundle: obeyed; the floor stays at 2.
    deploy(host, topics, old, devices=["atk-rollback"], groups=[], rollback=True)
    watcher.serving("atk-rollback", v1_id)
    floor = json.loads((agent.state_dir / "slots" / "default" / "floor.json").read_text())
    assert floor[old.model_name] == "2"


def test_mix_and_match_of_documents_and_offers_is_refused(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, host_keys: HostKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    v1 = demo_bundles["intel-x86-vnni"]
    start_agent("atk-mix", groups=("mix-line",))
    v1_id = deploy_to(host, topics, v1, devices=("atk-mix",))
    watcher.serving("atk-mix", v1_id)
    topic = topics.device_desired("atk-mix", "default")
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    manifest, _ = publish_bundle(host, topics, v2, block_size=16 * 1024)

    # Documents the operator really signed, for another device and for a group, moved onto this device's topic.
    deploy(host, topics, manifest, devices=["atk-elsewhere"], groups=["other-line"])
    for name, source in (("another device", topics.device_desired("atk-elsewhere", "default")),
                         ("a group this device is not in", topics.group_desired("other-line", "default"))):  # fmt: skip
        marker = len(watcher.events)
        host.publish(topic, retained(host, source), qos=1, retain=True, wait=5)
        event = refusal(watcher, "atk-mix", "bound to", after=marker)
        succeeded = slot_of(watcher.status["atk-mix"]).active_bundle != v1_id
        assert not attack_ledger.record(f"mix-and-match: a desired document for {name}", succeeded, event.detail)

    # A document the operator signed for this device's other slot, moved onto slot default's topic: the slot is
    # signed too, so it is valid only on its own slot's topic.
    other_slot = Desired(bundle_id=manifest.bundle_id, model_name=manifest.model_name,
                         model_version=manifest.model_version, profile=manifest.profile, slot="detector")  # fmt: skip
    marker = len(watcher.events)
    host.publish(topic, sign_desired(host_keys, other_slot, device_target("atk-mix")).encode(), qos=1, retain=True,
                 wait=5)  # fmt: skip
    event = refusal(watcher, "atk-mix", "for slot 'detector'", after=marker)
    succeeded = slot_of(watcher.status["atk-mix"]).active_bundle != v1_id
    assert not attack_ledger.record("mix-and-match: a desired document for another slot", succeeded, event.detail)

    # The genuine offer of another model's bundle, put on the desired bundle's offer topic.
    other = derive_bundle(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, model_name="other-model")
    _, other_offer = publish_bundle(host, topics, other, block_size=16 * 1024)
    host.publish(topics.bundle_offer(manifest.bundle_id), other_offer.encode(), qos=1, retain=True, wait=5)
    marker = len(watcher.events)
    deploy(host, topics, manifest, devices=["atk-mix"], groups=[])
    event = refusal(watcher, "atk-mix", "names bundle", after=marker)
    succeeded = slot_of(watcher.status["atk-mix"]).active_bundle != v1_id
    assert not attack_ledger.record("mix-and-match: another model's signed offer", succeeded, event.detail)

    # The same offer relabelled with the desired bundle's id: the signature covers the id.
    relabelled = other_offer.model_copy(update={"bundle_id": manifest.bundle_id})
    host.publish(topics.bundle_offer(manifest.bundle_id), relabelled.encode(), qos=1, retain=True, wait=5)
    marker = len(watcher.events)
    deploy(host, topics, manifest, devices=["atk-mix"], groups=[])
    event = refusal(watcher, "atk-mix", "does not verify", after=marker)
    succeeded = slot_of(watcher.status["atk-mix"]).active_bundle != v1_id
    assert not attack_ledger.record("mix-and-match: another offer relabelled", succeeded, event.detail)


@pytest.mark.slow
def test_a_device_frozen_on_an_expired_document_reports_stale_and_keeps_serving(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    start_agent("atk-freeze")
    manifest, _ = publish_bundle(host, topics, demo_bundles["intel-x86-vnni"], block_size=16 * 1024)
    # The 10 s document must reach a device that listens: on a loaded machine an agent still starting met it expired
    # ("not acting on it") and never installed anything.
    watcher.wait_for("atk-freeze online", lambda: (s := watcher.status.get("atk-freeze")) and s.online, timeout=120)
    deploy(host, topics, manifest, devices=["atk-freeze"], groups=[], ttl_s=10.0)
    watcher.serving("atk-freeze", manifest.bundle_id, timeout=120)
    # The attacker withholds every newer document (here: nobody publishes one).
    status = watcher.wait_for(
        "atk-freeze reporting stale desired state",
        lambda: (s := watcher.status.get("atk-freeze")) and s.desired_stale and s,
        timeout=60,
    )
    event = watcher.event("atk-freeze", "desired-stale")
    assert slot_of(status).active_bundle == manifest.bundle_id and slot_of(status).verified
    assert not attack_ledger.record("freeze a device on a stale desired document", False, event.detail)
    # A fresh signed document clears it.
    deploy(host, topics, manifest, devices=["atk-freeze"], groups=[])
    watcher.wait_for("stale cleared", lambda: (s := watcher.status.get("atk-freeze")) and not s.desired_stale)


def test_oversized_and_impossible_layouts_are_refused_once_before_any_download(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, host_keys: HostKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    agent = start_agent("atk-layout")
    v1 = demo_bundles["intel-x86-vnni"]
    v1_id = deploy_to(host, topics, v1, devices=("atk-layout",))
    watcher.serving("atk-layout", v1_id)
    mallory = attacker_keys(tmp_path / "mallory", host_keys)
    real = describe_transfer(v1, 4096)
    huge = Transfer(size=2 * 10**9, sha256=real.sha256, block_size=128 * 1024,
                    block_sha256=[real.sha256] * -(-2 * 10**9 // (128 * 1024)))  # fmt: skip
    impossible = real.model_copy(update={"block_sha256": real.block_sha256[:3]})
    cases = [
        ("oversized layout (2 GB) in an offer signed by the attacker", "5", huge, mallory, "untrusted key"),
        ("oversized layout (2 GB) signed by the real bundle key", "6", huge, host_keys, "profile allows"),
        ("impossible layout (3 blocks for the file) signed by the real key", "7", impossible, host_keys,
         "impossible layout"),
    ]  # fmt: skip
    ids: dict[str, str] = {}
    for name, version, transfer, signer, reason in cases:
        bundle = derive_bundle(v1, tmp_path, signing_key, trusted, model_version=version)
        manifest = manifest_of(bundle)
        ids[version] = manifest.bundle_id
        offer = sign_offer(manifest.bundle_id, read_signed_manifest(bundle).manifest_json, transfer,
                           signer.bundle_key(), host_keys.keyset())  # fmt: skip
        host.publish(topics.bundle_offer(manifest.bundle_id), offer.encode(), qos=1, retain=True, wait=5)
        deploy(host, topics, manifest, devices=["atk-layout"], groups=[])
        event = refusal(watcher, "atk-layout", reason)
        fetched = [e for e in watcher.events if e.bundle_id == manifest.bundle_id and e.kind == "download-started"]
        succeeded = bool(fetched) or slot_of(watcher.status["atk-layout"]).active_bundle != v1_id
        assert not attack_ledger.record(name, succeeded, event.detail)
    # Refused once: remembered on disk, not retried (the next reconcile passes over it).
    refused = json.loads((agent.state_dir / "slots" / "default" / "state.json").read_text())["refused"]
    assert len([k for k in refused if k.startswith(ids["7"] + "@")]) == 1
    assert len([e for e in watcher.events if e.bundle_id == ids["7"] and e.kind in REFUSALS]) == 1


def _tar_bomb(path: Path) -> Path:
    """A tar a parser must never see: thousands of entries, a path out of the directory and a link to /etc."""
    import io

    with tarfile.open(path, "w") as tar:
        for index in range(3000):
            info = tarfile.TarInfo(f"bomb/{index:05d}")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        escape = tarfile.TarInfo("../../escaped.txt")
        escape.size = 5
        tar.addfile(escape, io.BytesIO(b"owned"))
        link = tarfile.TarInfo("model.onnx")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    return path


def test_a_tar_bomb_never_reaches_the_tar_parser(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, host_keys: HostKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    agent = start_agent("atk-bomb")
    v1 = demo_bundles["intel-x86-vnni"]
    v1_id = deploy_to(host, topics, v1, devices=("atk-bomb",))
    watcher.serving("atk-bomb", v1_id, timeout=120)  # the install of v1 (30 s was too short on a loaded machine)
    bomb = _tar_bomb(tmp_path / "bomb.tar")
    block = 16 * 1024

    # 1. The attacker's blocks in place of a genuine bundle's: each fails its signed hash and is never written.
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    manifest, offer = publish_bundle(host, topics, v2, block_size=block, layout="blocks")
    for index, chunk in enumerate(iter_blocks(bomb, block)):
        if index < offer.transfer.block_count:
            host.publish(topics.bundle_block(manifest.bundle_id, index), chunk, qos=1, retain=True, wait=5)
    deploy(host, topics, manifest, devices=["atk-bomb"], groups=[])
    event = watcher.wait_for(
        "the corrupt download given up",
        lambda: next((e for e in watcher.events if e.bundle_id == manifest.bundle_id and e.kind == "error"), None),
        timeout=90,
    )
    assert "failed its sha256" in event.detail
    unpacked = [e for e in watcher.events if e.bundle_id == manifest.bundle_id and e.kind == "downloaded"]
    succeeded = bool(unpacked) or any(agent.state_dir.rglob("escaped.txt")) or any(agent.state_dir.rglob("bomb"))
    assert not attack_ledger.record("tar bomb in place of a genuine bundle's blocks", succeeded, event.detail)

    # 2. The tar bomb with an offer of its own (layout and hashes of the bomb), signed by the attacker.
    mallory = attacker_keys(tmp_path / "mallory", host_keys)
    v3 = manifest_of(derive_bundle(v1, tmp_path, signing_key, trusted, model_version="3"))
    for index, chunk in enumerate(iter_blocks(bomb, block)):
        host.publish(topics.bundle_block(v3.bundle_id, index), chunk, qos=1, retain=True, wait=5)
    forged = sign_offer(v3.bundle_id, read_signed_manifest(v1).manifest_json.replace(v1_id, v3.bundle_id),
                        describe_transfer(bomb, block), mallory.bundle_key(), host_keys.keyset())  # fmt: skip
    host.publish(topics.bundle_offer(v3.bundle_id), forged.encode(), qos=1, retain=True, wait=5)
    deploy(host, topics, v3, devices=["atk-bomb"], groups=[])
    event = refusal(watcher, "atk-bomb", "untrusted key")
    fetched = [e for e in watcher.events if e.bundle_id == v3.bundle_id and e.kind == "download-started"]
    succeeded = bool(fetched) or any(agent.state_dir.rglob("escaped.txt"))
    assert not attack_ledger.record("tar bomb with an offer signed by the attacker", succeeded, event.detail)
    assert slot_of(watcher.status["atk-bomb"]).active_bundle == v1_id and agent.alive
    assert not list((agent.state_dir / "bundles").glob("*.staging"))


@pytest.mark.slow
def test_rotation_and_revocation_reach_the_device_without_a_visit(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    from edgefleet.control.credentials import keyring

    directory = tmp_path / "fleet-keys"
    keyring.init(directory)
    keys = HostKeys(directory)
    agent = start_agent("atk-rotate", trust=directory / "root.pub")
    v1 = demo_bundles["intel-x86-vnni"]

    def ship(bundle: Path, **options: object) -> str:
        manifest, _ = publish_bundle(host, topics, bundle, block_size=16 * 1024, keys=keys)
        deploy(host, topics, manifest, devices=["atk-rotate"], groups=[], keys=keys, **options)  # type: ignore[arg-type]
        return manifest.bundle_id

    watcher.serving("atk-rotate", ship(v1))
    old_bundle_key, old_ops_key, old_keyset = keys.bundle_key(), keys.ops_key(), keys.keyset()

    # Rotation: a new bundle key; the new key set rides in the next offer and desired document.
    keyring.rotate(directory, "bundle")
    v2 = derive_bundle(v1, tmp_path, keys.bundle_key(), trusted, model_version="2")
    watcher.serving("atk-rotate", ship(v2))

    # Revocation of the old (stolen) bundle key; the attacker re-signs a genuine deployment's offer with it.
    keyring.revoke(directory, old_bundle_key.key_id)
    v3 = derive_bundle(v1, tmp_path, keys.bundle_key(), trusted, model_version="3")
    manifest, genuine = publish_bundle(host, topics, v3, block_size=16 * 1024, keys=keys)
    stolen = sign_offer(genuine.bundle_id, genuine.manifest_json, genuine.transfer, old_bundle_key, old_keyset)
    host.publish(topics.bundle_offer(manifest.bundle_id), stolen.encode(), qos=1, retain=True, wait=5)
    deploy(host, topics, manifest, devices=["atk-rotate"], groups=[], keys=keys)
    event = refusal(watcher, "atk-rotate", "untrusted key")
    succeeded = slot_of(watcher.status["atk-rotate"]).active_bundle == manifest.bundle_id
    assert not attack_ledger.record("offer signed by a revoked bundle key", succeeded, event.detail)
    # The genuine offer again, and a new decision: installed.
    host.publish(topics.bundle_offer(manifest.bundle_id), genuine.encode(), qos=1, retain=True, wait=5)
    deploy(host, topics, manifest, devices=["atk-rotate"], groups=[], keys=keys)
    watcher.serving("atk-rotate", manifest.bundle_id)

    # Ops key rotation; a document signed by the old ops key (with the old key set) is refused.
    keyring.rotate(directory, "ops")
    v4 = derive_bundle(v1, tmp_path, keys.bundle_key(), trusted, model_version="4")
    v4_id = ship(v4)
    watcher.serving("atk-rotate", v4_id)
    v1m = manifest_of(v1)
    stale_ops = HostKeys(tmp_path / "stale-ops")
    stale_ops.directory.mkdir()
    (stale_ops.directory / "ops.key").write_bytes(
        (directory / "retired" / f"ops-{old_ops_key.key_id}.key").read_bytes()
    )
    (stale_ops.directory / "keyset.json").write_text(old_keyset.model_dump_json())
    marker = len(watcher.events)
    publish_desired(host, topics, stale_ops, Desired(bundle_id=v1m.bundle_id, model_name=v1m.model_name,
                    model_version=v1m.model_version, profile=v1m.profile, rollback=True), device="atk-rotate",
                    wait=5)  # fmt: skip
    event = refusal(watcher, "atk-rotate", "not signed by a trusted operations key", after=marker)
    succeeded = slot_of(watcher.status["atk-rotate"]).active_bundle != v4_id
    assert not attack_ledger.record("desired document signed by a rotated-out ops key", succeeded, event.detail)

    # A restart keeps the newest key set: the bundle installed under the rotated key still loads.
    agent.stop()
    agent.start()
    watcher.serving("atk-rotate", v4_id, timeout=60)
    assert agent.alive
