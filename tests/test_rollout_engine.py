"""The rollout engine against simulated devices on a real Mosquitto: waves, guardrails, automatic rollback,
timeouts, pause/resume/abort, a control-plane restart, bad input and desired state with overrides.

Simulated devices speak the agent's protocol (status, telemetry, events, desired, offer, blocks); their
latency and golden agreement per bundle are set by the test, which makes breaches exact. The same engine
against real agents is in test_rollout_agents.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.publish import deploy
from edgefleet.control.registry import EmptyGroupError
from edgefleet.control.rollout import RolloutSpecError
from edgefleet.control.rollout_engine import bundle_ref, make_spec, prepare_rollout, request
from edgefleet.control.simulate import Behavior, BundleBehavior, SimFleet, synthetic_bundle
from edgefleet.control.store import Deployment, GroupDef, Store
from edgefleet.core.manifest import Manifest
from edgefleet.core.mqtt import Connection
from edgefleet.core.signing import SigningKey
from edgefleet.core.topics import Topics

from brokers import MosquittoBroker
from test_control_support import control_plane, finished, publish, rollout, sim_fleet, wait_until

FAST = {"baseline_s": 1.0, "observe_s": 1.0, "install_timeout_s": 6.0, "report_timeout_s": 2.0, "min_reports": 2}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("sim-bundles")
    return {
        "v1": synthetic_bundle(out, signing_key, version="1", size_bytes=200_000, seed=1),
        "v2": synthetic_bundle(out, signing_key, version="2", size_bytes=200_000, seed=2),
        "v3": synthetic_bundle(out, signing_key, version="3", size_bytes=200_000, seed=4),
        "v2-vnni": synthetic_bundle(out, signing_key, version="2", profile="intel-x86-vnni", seed=3),
    }


class Fleet:
    """A control plane, simulated devices on v1 in one agent-side group, and the bundles published."""

    def __init__(self, plane: Any, sims: SimFleet, group: str, manifests: dict[str, Manifest]) -> None:
        self.plane, self.sims, self.group, self.manifests = plane, sims, group, manifests

    @property
    def store(self) -> Store:
        return self.plane.store  # type: ignore[no-any-return]

    def start(self, bundle: str = "v2", **changes: Any) -> str:
        fields: dict[str, Any] = {
            "group": self.group, "bundles": [bundle_ref(self.manifests[bundle])], "canary": "1",
            "waves": ["50%", "100%"], "timing": FAST,
            "thresholds": {"max_latency_factor": 1.5, "max_golden_drop": 0.01, "max_error_rate": 0.05},
        }  # fmt: skip
        fields.update(changes)
        return prepare_rollout(self.store, make_spec(**fields)).id

    def active(self) -> dict[str, str | None]:
        return {d: s.active_bundle for d, s in self.sims.devices.items()}


@contextlib.contextmanager
def _fleet(mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path], name: str,
           count: int = 4, behavior: Behavior | None = None, **plane_options: Any) -> Iterator[Fleet]:  # fmt: skip
    devices = [f"{name}-{i}" for i in range(count)]
    group = f"{name}-group"
    with (
        control_plane(mosquitto.url, tmp_path, **plane_options) as plane,
        sim_fleet(mosquitto.url, devices, groups=[group], behavior=behavior or Behavior(requests_per_s=100.0)) as sims,
    ):
        manifests = {k: publish(host, plane.store, path) for k, path in bundles.items()}
        deploy(host, Topics(), manifests["v1"], devices=[], groups=[group])
        v1 = manifests["v1"].bundle_id
        wait_until("every device on v1", lambda: all(d.active_bundle == v1 for d in sims.devices.values()))
        wait_until("the registry", lambda: all((r := plane.store.device(d)) and r.active_bundle for d in devices))
        yield Fleet(plane, sims, group, manifests)


@pytest.fixture
def fleet(mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path],
          request: pytest.FixtureRequest) -> Iterator[Fleet]:  # fmt: skip
    name = request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    with _fleet(mosquitto, tmp_path, host, bundles, name) as fleet:
        yield fleet


def test_a_good_bundle_goes_through_every_wave_and_becomes_the_groups_deployment(fleet: Fleet) -> None:
    rollout_id = fleet.start()
    doc = finished(fleet.store, rollout_id)
    assert doc.state == "succeeded", doc.log
    assert [len(w.devices) for w in doc.waves] == [1, 1, 2]
    assert [w.state for w in doc.waves] == ["passed", "passed", "passed"]
    v2 = fleet.manifests["v2"].bundle_id
    assert set(fleet.active().values()) == {v2}
    for progress in doc.devices.values():
        assert progress.state == "passed"
        assert progress.baseline is not None and progress.baseline.p95_ms is not None, "measured before the wave"
        assert {f.criterion: f.ok for f in progress.findings} == {"latency": True, "golden": True, "errors": True}
    deployments = fleet.store.deployments()
    assert [(d.scope, d.target, d.bundle_id) for d in deployments] == [("group", fleet.group, v2)]
    assert {p.bundle_id for p in fleet.store.published().values()} == {v2}


@pytest.mark.parametrize(
    ("behavior", "breach"),
    [
        (BundleBehavior(latency_factor=3.0), "p95"),
        (BundleBehavior(golden_agreement=0.9), "golden agreement 0.900 is below baseline 1.000"),
        (BundleBehavior(error_rate=0.2), "error rate"),
        (BundleBehavior(refuse="golden set failed on this device"), "golden set failed on this device"),
    ],
    ids=["slower", "less-accurate", "erroring", "refused-by-device"],
)
def test_a_canary_that_breaches_a_threshold_is_rolled_back(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path], behavior: BundleBehavior,
    breach: str,
) -> None:  # fmt: skip
    sims = Behavior(requests_per_s=100.0, bundles={"sim-model-2-generic-x86-64": behavior})
    name = f"breach-{breach[:6].replace(' ', '')}"
    with _fleet(mosquitto, tmp_path, host, bundles, name, behavior=sims) as fleet:
        rollout_id = fleet.start()
        doc = finished(fleet.store, rollout_id)
        assert doc.state == "rolled-back", doc.log
        assert doc.waves[0].state == "failed" and breach in doc.waves[0].verdict
        assert [w.state for w in doc.waves[1:]] == ["pending", "pending"], "later waves never start"
        canary = doc.waves[0].devices[0]
        assert doc.devices[canary].state == "rolled-back"
        v1 = fleet.manifests["v1"].bundle_id
        assert set(fleet.active().values()) == {v1}, "the canary is back on v1, the others never left it"
        pins = {d.target: d for d in fleet.store.deployments()}
        assert pins[canary].bundle_id == v1 and pins[canary].rollback, "the rollback is marked for the agent"
        others = [d for d in fleet.sims.devices if d != canary]
        assert not any(e.bundle_id == fleet.manifests["v2"].bundle_id for d in others
                       for e in fleet.store.events(device_id=d))  # fmt: skip


def test_a_device_that_never_reports_times_out(fleet: Fleet) -> None:
    silent = sorted(fleet.sims.devices)[-1]
    fleet.sims.kill(silent)  # its last will marks it offline; it will never install anything
    wait_until("the last will", lambda: not fleet.store.device(silent).online)  # type: ignore[union-attr]
    quick = {**FAST, "install_timeout_s": 3.0}
    rollout_id = fleet.start(max_failed_devices=1, waves=["100%"], timing=quick)
    doc = finished(fleet.store, rollout_id)
    assert doc.state == "succeeded", doc.log
    assert doc.waves[-1].devices[-1] == silent, "offline devices come last"
    progress = doc.devices[silent]
    reason = f"{progress.state}: {progress.reason}"
    assert reason.startswith("timed-out: ") and "within 3 s (device: offline, offline)" in reason, reason

    strict = fleet.start(bundle="v3", waves=["100%"], timing=quick)  # no failure tolerated
    doc = finished(fleet.store, strict)
    assert doc.state == "rolled-back" and f"{silent} timed-out" in doc.outcome
    v2 = fleet.manifests["v2"].bundle_id
    assert set(fleet.active().values()) == {v2}, "the devices that took v3 went back to v2"


def test_a_rollout_to_an_older_version_is_refused_by_the_devices(fleet: Fleet) -> None:
    assert finished(fleet.store, fleet.start(bundle="v2", waves=["100%"])).state == "succeeded"
    doc = finished(fleet.store, fleet.start(bundle="v1"))
    assert doc.state == "rolled-back" and "version 1 is not newer than 2" in doc.outcome


def test_pause_holds_a_rollout_resume_continues_and_abort_rolls_back(fleet: Fleet) -> None:
    rollout_id = fleet.start(timing={**FAST, "observe_s": 2.0})
    wait_until("the canary", lambda: rollout(fleet.store, rollout_id).waves[0].state == "observing", timeout=20)
    request(fleet.store, rollout_id, "pause")
    wait_until("paused", lambda: rollout(fleet.store, rollout_id).state == "paused")
    time.sleep(3.0)
    doc = rollout(fleet.store, rollout_id)
    assert doc.state == "paused" and doc.waves[0].state == "observing", "no verdict while paused"
    request(fleet.store, rollout_id, "resume")
    wait_until("wave 1", lambda: rollout(fleet.store, rollout_id).current_wave == 1, timeout=20)
    request(fleet.store, rollout_id, "abort")
    doc = finished(fleet.store, rollout_id)
    assert doc.state == "aborted" and doc.outcome == "aborted by operator"
    v1 = fleet.manifests["v1"].bundle_id
    assert set(fleet.active().values()) == {v1}
    operator = [m.message for m in doc.log if "operator" in m.message]
    assert len(operator) == 3 and operator[0] == "paused by operator" and operator[2] == "aborted by operator"
    assert operator[1].startswith("resumed by operator after")
    with pytest.raises(RolloutSpecError, match="has ended"):
        request(fleet.store, rollout_id, "resume")


def test_a_rollout_survives_a_restart_of_the_control_plane(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    with _fleet(mosquitto, tmp_path, host, bundles, "restart", count=4, instance="restart-cp") as fleet:
        rollout_id = fleet.start(timing={**FAST, "observe_s": 2.0})
        wait_until("wave 1", lambda: rollout(fleet.store, rollout_id).current_wave >= 1, timeout=30)
        fleet.plane.stop(retire=False)  # the process goes away mid-rollout; its session keeps its telemetry
        time.sleep(1.0)
        with control_plane(mosquitto.url, tmp_path, instance="restart-cp") as second:
            doc = finished(second.store, rollout_id)
            assert doc.state == "succeeded", doc.log
            assert set(fleet.active().values()) == {fleet.manifests["v2"].bundle_id}
            assert any(p.state == "passed" for p in doc.devices.values())


def test_bad_rollouts_are_refused_with_reasons(fleet: Fleet) -> None:
    with pytest.raises(EmptyGroupError, match="group 'nobody' has no devices"):
        fleet.start(group="nobody")
    with pytest.raises(RolloutSpecError, match=r"4 device\(s\) of group .* have a profile no bundle is built for: .*"
                       r"\(generic-x86-64\).*the bundles are for intel-x86-vnni"):  # fmt: skip
        fleet.start(bundle="v2-vnni")
    first = fleet.start(timing={**FAST, "baseline_s": 30.0})
    with pytest.raises(RolloutSpecError, match=f"rollout {first} .* still holds 4 of these devices"):
        fleet.start()
    request(fleet.store, first, "abort")
    assert finished(fleet.store, first).state == "aborted"


def test_desired_state_resolves_base_group_and_device_overrides_per_device(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, signing_key: SigningKey
) -> None:
    out = tmp_path / "bundles"
    out.mkdir()
    files = {v: synthetic_bundle(out, signing_key, model_name="desired", version=v, seed=int(v)) for v in "123"}
    devices = ["ds-a", "ds-b", "ds-c"]
    with control_plane(mosquitto.url, tmp_path) as plane, sim_fleet(mosquitto.url, devices) as sims:
        store = plane.store
        m = {v: publish(host, store, path) for v, path in files.items()}
        wait_until("the registry", lambda: all(store.device(d) for d in devices))
        store.set_labels("ds-b", {"site": "berlin"})
        store.set_labels("ds-c", {"site": "berlin"})
        store.put_group(GroupDef("berlin", (), "site=berlin", priority=5))

        def put(scope: str, target: str, v: str, rollback: bool = False) -> None:
            store.put_deployment(Deployment(scope, target, "generic-x86-64", m[v].bundle_id, "desired", v,  # type: ignore[arg-type]
                                            rollback=rollback))  # fmt: skip

        put("fleet", "*", "1")
        put("group", "berlin", "2")
        put("device", "ds-c", "3")
        expected = {"ds-a": m["1"].bundle_id, "ds-b": m["2"].bundle_id, "ds-c": m["3"].bundle_id}
        wait_until("each device on its resolved bundle", lambda: {d: s.active_bundle for d, s in
                                                                  sims.devices.items()} == expected)  # fmt: skip
        # Removing the override falls back to the group's bundle: an older version, so it is marked a rollback.
        store.delete_deployment("device", "ds-c")
        put("group", "berlin", "2", rollback=True)
        wait_until("ds-c back on the group's bundle", lambda: sims.devices["ds-c"].active_bundle == m["2"].bundle_id)
        store.delete_deployment("group", "berlin")
        store.delete_deployment("fleet", "*")
        wait_until("desired topics cleared", lambda: store.published() == {})


def test_one_rollout_ships_one_bundle_per_profile(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    group = "mixed-group"
    with (
        control_plane(mosquitto.url, tmp_path) as plane,
        sim_fleet(mosquitto.url, ["mixed-g0", "mixed-g1"], groups=[group]) as generic,
        sim_fleet(mosquitto.url, ["mixed-v0", "mixed-v1"], groups=[group], profile="intel-x86-vnni") as vnni,
    ):
        manifests = {k: publish(host, plane.store, bundles[k]) for k in ("v2", "v2-vnni")}
        wait_until("the registry", lambda: all(plane.store.device(d) for d in [*generic.devices, *vnni.devices]))
        # These devices run nothing yet: there is no baseline to judge latency or golden agreement against, so
        # the operator says, explicitly and on the record, that these two may go unjudged.
        spec = make_spec(group=group, bundles=[bundle_ref(manifests["v2"]), bundle_ref(manifests["v2-vnni"])],
                         canary="1", waves=["100%"], timing=FAST, allow_unjudged=["latency", "golden"])  # fmt: skip
        doc = finished(plane.store, prepare_rollout(plane.store, spec).id)
        assert doc.state == "succeeded", doc.log
        assert any("the operator allows unjudged: latency, golden" in e.message for e in doc.log)
        for progress in doc.devices.values():
            verdict = {f.criterion: (f.ok, f.detail.split(":")[0]) for f in progress.findings}
            assert verdict["latency"] == (None, "not judged, allowed by the operator"), progress.findings
            assert verdict["errors"][0] is True
        assert {d.active_bundle for d in generic.devices.values()} == {manifests["v2"].bundle_id}
        assert {d.active_bundle for d in vnni.devices.values()} == {manifests["v2-vnni"].bundle_id}
        # These devices ran nothing before: no baseline, so only absolute criteria could apply.
        assert all(p.baseline is None and p.previous_bundle is None for p in doc.devices.values())
        deployments = {(d.scope, d.target, d.profile) for d in plane.store.deployments()}
        assert deployments == {("group", group, "generic-x86-64"), ("group", group, "intel-x86-vnni")}


def test_a_first_install_without_a_baseline_fails_for_lack_of_data_unless_allowed(
    mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path]
) -> None:
    group = "blind-group"
    with (
        control_plane(mosquitto.url, tmp_path) as plane,
        sim_fleet(mosquitto.url, ["blind-0", "blind-1"], groups=[group]) as sims,
    ):
        manifest = publish(host, plane.store, bundles["v2"])
        wait_until("the registry", lambda: all(plane.store.device(d) for d in sims.devices))
        spec = make_spec(group=group, bundles=[bundle_ref(manifest)], canary="1", waves=["100%"], timing=FAST)
        doc = finished(plane.store, prepare_rollout(plane.store, spec).id)
        assert doc.state == "rolled-back", doc.log
        assert "no data for latency: no baseline p95: the device ran no bundle before the wave" in doc.outcome
        assert [w.state for w in doc.waves] == ["failed", "pending"]
