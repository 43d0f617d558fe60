"""Desired state per slot on a real Mosquitto (issue 33): each slot of a device has its own signed, counted,
retained document on `devices/{id}/desired/{slot}`; changing one slot re-signs that slot only; removing a slot is a
signed decision made with `edgefleet desired remove`; and the documents a single-model control plane left on the
legacy `.../desired` topics move to the default slot, byte for byte, before the legacy topic is cleared."""

from __future__ import annotations

import time
from pathlib import Path

from edgefleet.cli.main import main as cli
from edgefleet.control.broker.retained import read_retained
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.legacy import migrate_legacy_desired
from edgefleet.control.desired.signing import sign_desired, unverified_desired
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.rights.documents import load_root, verified_named
from edgefleet.control.store import Deployment, open_store
from edgefleet.core.messages import Desired, DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.rollouts.control_plane import control_plane, enroll, wait_until
from support.servers.brokers import MosquittoBroker

TOPICS = Topics()


def _retained(conn: Connection, *filters: str) -> dict[str, bytes]:
    found, complete = read_retained(conn, TOPICS.prefix, list(filters), 15)
    assert complete
    return found


def _desired(bundle: str) -> Desired:
    return Desired(bundle_id=bundle, model_name="m", model_version="1", profile="generic-x86-64")


def test_legacy_documents_move_to_the_default_slot_byte_for_byte_then_the_legacy_topics_are_cleared(
    host_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    legacy = {
        TOPICS.legacy_device_desired("d1"): sign_desired(host_keys, _desired("a-1"), "device:d1").encode(),
        TOPICS.legacy_group_desired("g1"): sign_desired(host_keys, _desired("a-2"), "group:g1").encode(),
        TOPICS.legacy_device_desired("d2"): sign_desired(host_keys, _desired("old"), "device:d2").encode(),
    }
    newer = sign_desired(host_keys, _desired("new"), "device:d2").encode()
    root = load_root(host_keys.root_public())
    assert root is not None
    with MosquittoBroker() as broker:
        host = Connection(broker.url, "legacy-host").start()
        try:
            for topic, payload in legacy.items():
                host.publish(topic, payload, retain=True, wait=10)
            host.publish(TOPICS.device_desired("d2", "default"), newer, retain=True, wait=10)

            report = migrate_legacy_desired(host, TOPICS)
            assert sorted(report.moved) == sorted(
                [TOPICS.legacy_device_desired("d1"), TOPICS.legacy_group_desired("g1")]
            )
            assert report.kept == [TOPICS.legacy_device_desired("d2")], "a document already on the slot is newer"
            slots = _retained(host, f"{TOPICS.prefix}/devices/+/desired/+", f"{TOPICS.prefix}/groups/+/desired/+")
            assert slots == {
                TOPICS.device_desired("d1", "default"): legacy[TOPICS.legacy_device_desired("d1")],
                TOPICS.group_desired("g1", "default"): legacy[TOPICS.legacy_group_desired("g1")],
                TOPICS.device_desired("d2", "default"): newer,
            }, "the same signed bytes: same counter, expiry and signature"
            for topic, payload in slots.items():
                assert verified_named(TOPICS, topic, payload, root) is not None, f"a device accepts it on {topic}"
            assert _retained(host, f"{TOPICS.prefix}/devices/+/desired", f"{TOPICS.prefix}/groups/+/desired") == {}
            again = migrate_legacy_desired(host, TOPICS)
            assert again.moved == again.kept == again.cleared == [], "run again, it finds nothing"

            # The control plane does it at start, before its first sync.
            host.publish(TOPICS.legacy_device_desired("d3"), legacy[TOPICS.legacy_device_desired("d1")], retain=True,
                         wait=10)  # fmt: skip
            with control_plane(broker.url, tmp_path):
                wait_until(
                    "d3's document on its default slot",
                    lambda: (
                        TOPICS.device_desired("d3", "default") in _retained(host, TOPICS.device_desired_slots("d3"))
                    ),
                )
                wait_until("the legacy topic cleared", lambda: not _retained(host, TOPICS.legacy_device_desired("d3")))
        finally:
            host.stop()


def test_each_slot_has_its_own_signed_document_and_a_change_re_signs_that_slot_only(
    host_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path}/control.sqlite"
    store = open_store(url)
    root = load_root(host_keys.root_public())
    assert root is not None
    default, assistant = TOPICS.device_desired("d1", "default"), TOPICS.device_desired("d1", "assistant")
    with MosquittoBroker() as broker:
        host = Connection(broker.url, "slots-host").start()
        try:
            store.upsert_statuses(
                [DeviceStatus(device_id="d1", online=True, state="idle", profile="generic-x86-64")], time.time()
            )
            enroll(store, ["d1"], [])
            put = store.put_deployment
            put(Deployment("device", "d1", "generic-x86-64", "det-1", "det", "1", updated_at=1.0))
            put(Deployment("device", "d1", "generic-x86-64", "lm-1", "lm", "1", slot="assistant", updated_at=1.0))
            publisher = DesiredPublisher(host, TOPICS, store, host_keys)
            assert sorted(publisher.sync().published) == ["d1", "d1/assistant"]
            first = _retained(host, TOPICS.device_desired_slots("d1"))
            assert set(first) == {default, assistant}
            for topic, slot in ((default, "default"), (assistant, "assistant")):
                desired = unverified_desired(first[topic])
                assert desired.slot == slot and desired.target == "device:d1", "bound to its own topic"
                assert verified_named(TOPICS, topic, first[topic], root) is not None

            put(Deployment("device", "d1", "generic-x86-64", "lm-2", "lm", "2", slot="assistant", updated_at=2.0))
            assert publisher.sync().published == ["d1/assistant"], "the default slot is not signed again"
            second = _retained(host, TOPICS.device_desired_slots("d1"))
            assert second[default] == first[default], "byte-identical: same counter"
            new, old = unverified_desired(second[assistant]), unverified_desired(first[assistant])
            assert new.bundle_id == "lm-2" and new.counter > old.counter

            # Removing a slot: a signed decision, through the CLI and the store, published by the sync.
            assert cli(["desired", "remove", "--device", "d1", "--slot", "assistant", "--store", url]) == 0
            assert publisher.sync().published == ["d1/assistant"]
            removal = _retained(host, assistant)[assistant]
            removed = unverified_desired(removal)
            assert removed.remove and removed.slot == "assistant" and removed.bundle_id == ""
            named = verified_named(TOPICS, assistant, removal, root)
            assert named is not None and named.bundles == frozenset(), "signed, and it names no bundle"
            assert _retained(host, default)[default] == first[default]
            assert [(d.slot, d.remove) for d in store.deployments()] == [("assistant", True), ("default", False)]

            assert cli(["desired", "clear", "--device", "d1", "--slot", "assistant", "--store", url]) == 0
            assert publisher.sync().cleared == ["d1/assistant"], "withdrawn: a signed clear of that slot"
            assert unverified_desired(_retained(host, assistant)[assistant]).clear
            assert [d.slot for d in store.deployments()] == ["default"]
        finally:
            host.stop()
            store.close()


def test_a_slots_class_and_objective_travel_in_its_signed_document_and_outlive_a_new_bundle(
    host_keys: keyring.HostKeys, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path}/control.sqlite"
    store = open_store(url)
    detector, reader = TOPICS.device_desired("d1", "detector"), TOPICS.device_desired("d1", "reader")
    with MosquittoBroker() as broker:
        host = Connection(broker.url, "policy-host").start()
        try:
            store.upsert_statuses(
                [DeviceStatus(device_id="d1", online=True, state="idle", profile="generic-x86-64")], time.time()
            )
            enroll(store, ["d1"], ["line"])
            put = store.put_deployment
            put(Deployment("group", "line", "generic-x86-64", "det-1", "det", "1", slot="detector", updated_at=1.0))
            put(Deployment("group", "line", "generic-x86-64", "rd-1", "rd", "1", slot="reader", updated_at=1.0))
            publisher = DesiredPublisher(host, TOPICS, store, host_keys)
            publisher.sync()
            first = _retained(host, detector, reader)
            assert unverified_desired(first[detector]).slot_class == "interactive", "no policy: interactive"

            # The group's policy: published with the detector's document, re-signed with the same decision.
            assert cli(["desired", "schedule", "--group", "line", "--slot", "detector", "--class", "real-time",
                        "--objective-ms", "30", "--store", url]) == 0  # fmt: skip
            assert publisher.sync().published == ["d1/detector"], "the reader's document is not signed again"
            second = _retained(host, detector, reader)
            assert second[reader] == first[reader]
            old, new = unverified_desired(first[detector]), unverified_desired(second[detector])
            assert (new.slot_class, new.latency_objective_ms) == ("real-time", 30.0)
            assert (new.bundle_id, new.issued_at) == (old.bundle_id, old.issued_at), "the same decision on the bundle"
            assert publisher.sync().published == [], "published once"

            # A new bundle of the slot (as a rollout writes it) keeps the slot's policy.
            put(Deployment("group", "line", "generic-x86-64", "det-2", "det", "2", slot="detector", updated_at=2.0))
            publisher.sync()
            third = unverified_desired(_retained(host, detector)[detector])
            assert (third.bundle_id, third.slot_class, third.latency_objective_ms) == ("det-2", "real-time", 30.0)

            # The device's own policy beats its group's; withdrawing it gives the group's back.
            assert cli(["desired", "schedule", "--device", "d1", "--slot", "detector", "--class", "batch",
                        "--store", url]) == 0  # fmt: skip
            publisher.sync()
            assert unverified_desired(_retained(host, detector)[detector]).slot_class == "batch"
            assert cli(["desired", "schedule", "--device", "d1", "--slot", "detector", "--clear", "--store", url]) == 0
            publisher.sync()
            back = unverified_desired(_retained(host, detector)[detector])
            assert (back.slot_class, back.latency_objective_ms) == ("real-time", 30.0)

            # Refused with the reason, nothing stored: an objective on a batch slot, a bad number, a bad class.
            for bad in (["--class", "batch", "--objective-ms", "5"], ["--class", "real-time", "--objective-ms", "nan"],
                        ["--class", "real-time", "--objective-ms", "-1"]):  # fmt: skip
                assert cli(["desired", "schedule", "--group", "line", "--slot", "detector", *bad, "--store", url]) != 0
            assert [(p.target, p.slot_class, p.latency_objective_ms) for p in store.slot_policies()] == [
                ("line", "real-time", 30.0)
            ]
            assert publisher.sync().published == []
        finally:
            host.stop()
            store.close()
