"""Rollouts of one slot on devices that run several models (issue 33), against simulated devices on a real
Mosquitto: the devices run a default slot (where the rollout installs) and a `detector` slot beside it with a
latency objective (support.simulate.scenario.Neighbour).

- a rollout re-signs only its slot's documents: the other slot's retained document stays byte-identical;
- the neighbour guardrail rolls back a version that pushes the other slot outside its objective, with the reason;
- planning refuses a bundle that would not fit beside the other slot in the profile's memory budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.control.broker.retained import read_retained
from edgefleet.control.rollout.plan import RolloutSpecError
from edgefleet.control.store import Deployment
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.rollouts.control_plane import finished, publish, wait_until
from support.rollouts.fleet import make_fleet
from support.servers.brokers import MosquittoBroker
from support.simulate.agents import Behavior, Neighbour, synthetic_bundle

V2 = "sim-model-2-generic-x86-64"


def _detector_documents(host: Connection, devices: list[str]) -> dict[str, bytes]:
    topics = Topics()
    found, complete = read_retained(host, topics.prefix, [topics.device_desired(d, "detector") for d in devices], 15)
    assert complete
    return found


def test_a_rollout_of_one_slot_leaves_the_other_slots_retained_documents_byte_identical(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    sims = Behavior(requests_per_s=100.0, neighbours={"detector": Neighbour("det-1", objective_ms=30.0, p95_ms=10.0)})
    with make_fleet(mosquitto, tmp_path, host, bundles, "slot-keep", behavior=sims) as fleet:
        devices = sorted(fleet.sims.devices)
        for device in devices:  # each device's detector slot: an override the control plane publishes
            fleet.store.put_deployment(
                Deployment("device", device, "generic-x86-64", "det-1", "det", "1", slot="detector", updated_at=1.0)
            )
        before = wait_until(
            "the detector documents", lambda: (docs := _detector_documents(host, devices)) and len(docs) == 4 and docs
        )
        default_before = read_retained(host, "edgefleet", [Topics().device_desired(devices[0], "default")], 15)[0]
        doc = finished(fleet.store, fleet.start())
        assert doc.state == "succeeded", doc.log
        assert doc.spec.slot == "default" and set(fleet.active().values()) == {V2}
        assert _detector_documents(host, devices) == before, "not re-published: same bytes, same counters"
        default_after = read_retained(host, "edgefleet", [Topics().device_desired(devices[0], "default")], 15)[0]
        assert default_after != default_before, "the rolled-out slot's document was re-signed"
        published = fleet.store.published()
        assert {published[(d, "detector")].bundle_id for d in devices} == {"det-1"}
        assert {published[(d, "default")].bundle_id for d in devices} == {V2}


def test_the_neighbour_guardrail_rolls_back_a_version_that_starves_another_slot(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    detector = Neighbour("det-1", objective_ms=30.0, p95_ms=20.0, p95_beside={V2: 45.0})
    sims = Behavior(requests_per_s=100.0, neighbours={"detector": detector})
    with make_fleet(mosquitto, tmp_path, host, bundles, "slot-starve", behavior=sims) as fleet:
        doc = finished(fleet.store, fleet.start())
        assert doc.state == "rolled-back", doc.log
        canary = doc.waves[0].devices[0]
        reason = doc.devices[canary].reason
        assert "slot detector p95 45 ms > objective 30 ms since default v2 arrived" in reason, reason
        assert all(p.state in ("rolled-back", "waiting") for p in doc.devices.values()), doc.log
        assert doc.devices[canary].state == "rolled-back"


def test_planning_refuses_a_bundle_that_does_not_fit_beside_the_other_slot(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path], signing_key: SigningKey
) -> None:
    big = synthetic_bundle(tmp_path, signing_key, version="5", seed=9, peak_memory_mb=610.0)
    det = synthetic_bundle(tmp_path, signing_key, model_name="det", version="1", seed=8, peak_memory_mb=1628.0)
    sims = Behavior(neighbours={"detector": Neighbour("det-1-generic-x86-64", objective_ms=30.0)})
    with make_fleet(mosquitto, tmp_path, host, bundles, "slot-fit", count=2, behavior=sims) as fleet:
        publish(host, fleet.store, det)
        fleet.manifests["big"] = publish(host, fleet.store, big)
        with pytest.raises(RolloutSpecError) as refused:
            fleet.start("big")
        message = str(refused.value)
        assert "2 device(s) of group" in message and "cannot hold the bundle in slot 'default'" in message
        assert "default needs 610 MB, 420 MB free after detector (budget 2048 MB)" in message, message
        assert fleet.store.rollouts() == [], "nothing planned, nothing published to a device"
        doc = finished(fleet.store, fleet.start("v2"))  # v2 was built before peaks were measured: files x 2 fits
        assert doc.state == "succeeded", doc.log
