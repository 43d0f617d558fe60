"""Only the host's own records decide a rollout (issue 20 item 1), and its states say what happened to each
device (issue 22 item 3): simulated devices on a real Mosquitto, the real control plane.

- A device never enrolled that claims the group is not planned; the rollout of the enrolled ones completes, and
  the dashboard offers the group with the device left out, never a group only a report names.
- A device reporting a made-up active bundle has no rollback target: the rolled-back rollout signs no document
  naming it, the device "kept" what it runs, and the others went back.
- A device that refuses the bundle reads "refused"; a later rollout of the same version warns about it.
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.control.dashboard.views import api_groups, rollout_summary
from edgefleet.core.mqtt.connection import Connection

from support.rollouts.control_plane import finished, sim_fleet, wait_until
from support.rollouts.fleet import make_fleet
from support.servers.brokers import MosquittoBroker
from support.simulate.agents import Behavior, BundleBehavior

V1, V2 = "sim-model-1-generic-x86-64", "sim-model-2-generic-x86-64"


def test_a_device_that_only_claims_the_group_is_left_out_and_the_rollout_completes(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    with (
        make_fleet(mosquitto, tmp_path, host, bundles, "claim", count=2) as fleet,
        sim_fleet(mosquitto.url, ["claim-stranger"], groups=[fleet.group]),
        sim_fleet(mosquitto.url, ["claim-other"], groups=["made-up-group"]),
    ):
        wait_until("the strangers", lambda: fleet.store.device("claim-stranger") and fleet.store.device("claim-other"))
        doc = finished(fleet.store, fleet.start(waves=["100%"]))
        assert doc.state == "succeeded", doc.log
        assert set(doc.devices) == {"claim-0", "claim-1"}, "the stranger is not planned"
        assert doc.left_out["claim-stranger"].startswith(f"not enrolled: reports group {fleet.group}")
        assert fleet.sims.devices["claim-0"].active_bundle == V2
        groups = {g["name"]: g for g in api_groups(fleet.store)["groups"]}
        assert groups[fleet.group]["plannable"] and groups[fleet.group]["rollout_members"] == ["claim-0", "claim-1"]
        assert "claim-stranger" in groups[fleet.group]["left_out"]
        assert not groups["made-up-group"]["plannable"] and groups["made-up-group"]["kind"] == "reported"
        assert "claim-stranger" in rollout_summary(doc)["left_out"]


def test_a_made_up_active_bundle_never_reaches_a_signed_document(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    slow = Behavior(requests_per_s=100.0, bundles={V2: BundleBehavior(latency_factor=3.0)})
    with make_fleet(mosquitto, tmp_path, host, bundles, "madeup", count=2, behavior=slow) as fleet:
        liar = "madeup-0"

        def lie() -> None:
            device = fleet.sims.devices[liar]
            device.active_bundle, device.active_model = "made-up-bundle-9", "made-up@9"
            device.publish_status()

        fleet.sims.call(lie)
        wait_until("the lie", lambda: fleet.store.device(liar).running() == "made-up-bundle-9")  # type: ignore[union-attr]
        doc = finished(fleet.store, fleet.start(canary="2", waves=["100%"]))
        assert doc.state == "rolled-back", doc.log
        progress = doc.devices[liar]
        assert progress.reported_bundle == "made-up-bundle-9" and progress.previous_bundle is None
        assert progress.state == "kept" and "which the store never published" in progress.reason, progress.reason
        honest = doc.devices["madeup-1"]
        assert honest.state == "rolled-back" and honest.previous_bundle == V1
        named = {d.bundle_id for d in fleet.store.deployments()} | {
            p.bundle_id for p in fleet.store.published().values()
        }
        assert "made-up-bundle-9" not in named, "the device's string was never signed into a document"
        assert fleet.sims.devices["madeup-1"].active_bundle == V1


def test_a_refusing_device_reads_refused_and_the_next_rollout_of_that_version_warns(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    refusing = Behavior(requests_per_s=100.0, bundles={V2: BundleBehavior(refuse="not on this device")})
    with make_fleet(mosquitto, tmp_path, host, bundles, "refuser", count=1, behavior=refusing) as fleet:
        first = finished(fleet.store, fleet.start(waves=["100%"]))
        (progress,) = first.devices.values()
        # a refusal while it runs a bundle is "refused": it never left that bundle, so the rollout failed
        assert progress.state == "refused" and "not on this device" in progress.reason, progress
        assert first.state == "failed", first.log
        second = finished(fleet.store, fleet.start(waves=["100%"]))
        (again,) = second.devices.values()
        assert any(f"in rollout {first.id}" in w for w in again.warnings), again.warnings
        assert any("warning: refuser-0" in e.message for e in second.log)
