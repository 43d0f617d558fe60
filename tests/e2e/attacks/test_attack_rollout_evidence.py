"""Issue 20's rollout attacks, each with one device certificate, on the shipped secure Mosquitto configuration,
real agents and a real control plane; each counted in the attack ledger:

- a made-up `active_bundle` in a group that is rolled back (it must never reach a signed document);
- an unenrolled device claiming a group (it must not be planned);
- a fake-committed canary that downloaded nothing (it must not pass);
- an implausibly fast canary (it must not pass);
- the control plane's dashboard held by 1,200 idle connections and flooded with failed logins.

After each attack the fleet still works: a valid rollout of the group "line" (real agents, a group none of the
liars is enrolled in) completes within its timeouts, and the engine never stops ticking.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgefleet.control.dashboard.auth import issue_token
from edgefleet.control.dashboard.views import api_groups
from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.rollout.engine import bundle_ref, load_doc, make_spec, prepare_rollout
from edgefleet.control.rollout.plan import RolloutDoc
from edgefleet.control.server import ControlPlane
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import Desired, OutputScore
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.common import TOPICS, deploy_group
from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.rollouts.agents import Traffic
from support.rollouts.control_plane import control_plane, finished, publish, wait_until
from support.rollouts.lying_device import Claims, LyingDevice
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki
from support.slots import slot_of

pytestmark = pytest.mark.slow

PROFILE = "intel-x86-vnni"
LINE = ["ev-line-0", "ev-line-1"]
LAB = "ev-lab-0"
LIARS = ["ev-madeup", "ev-claimer", "ev-fake", "ev-fast"]
MADE_UP = "made-up-bundle-7"
# The attacks are judged by evidence; latency noise on this loaded machine is not under test here.
THRESHOLDS = {"max_latency_factor": 10.0, "latency_slack_ms": 20.0, "max_golden_drop": 0.05, "max_error_rate": 0.05,
              "min_requests": 10}  # fmt: skip
TIMING = {"baseline_s": 3.0, "observe_s": 3.0, "install_timeout_s": 60.0, "report_timeout_s": 20.0, "min_reports": 2}


@dataclass
class Fleet:
    broker: SecureBroker
    plane: ControlPlane
    operator: Connection
    watcher: FleetWatcher
    bundles: dict[str, Path]
    manifests: dict[str, Manifest]
    line_version: int = 1

    def rollout(self, group: str, version: str, **changes: object) -> RolloutDoc:
        if version not in self.manifests:
            self.manifests[version] = publish(self.operator, self.plane.store, self.bundles[version])
        fields: dict[str, object] = {
            "group": group,
            "bundles": [bundle_ref(self.manifests[version])],
            "canary": "1",
            "waves": ["100%"],
            "thresholds": THRESHOLDS,
            "timing": TIMING,
        }
        fields.update(changes)  # fmt: skip
        return finished(self.plane.store, prepare_rollout(self.plane.store, make_spec(**fields)).id, timeout=240)

    def line_still_works(self) -> tuple[bool, str]:
        """A valid rollout of the next version on the line group: (it succeeded, why not)."""
        self.line_version += 1
        doc = self.rollout("line", str(self.line_version))
        ok = doc.state == "succeeded"
        served = all(slot_of(self.watcher.status[d]).active_bundle == self.manifests[str(self.line_version)].bundle_id
                     for d in LINE)  # fmt: skip
        return ok and served, f"line v{self.line_version}: {doc.state} ({doc.outcome})"

    def engine_ticks(self) -> bool:
        snapshot = self.plane.engine.health.snapshot(time.time())
        return snapshot.last_tick is not None and time.time() - snapshot.last_tick < 3 * self.plane.config.tick_s + 5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, demo_bundles: dict[str, Path], signing_key: SigningKey,
          keys: tuple[Path, Path], root_pub: Path) -> Iterator[Fleet]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("rollout-evidence")
    trusted = TrustedKeys.load([keys[1]])
    bundles = {"1": demo_bundles[PROFILE]}
    for version in range(2, 8):
        bundles[str(version)] = derive_bundle(bundles["1"], tmp, signing_key, trusted, model_version=str(version))
    pki = make_pki(tmp / "pki", [*LINE, LAB, *LIARS])
    with SecureBroker(pki, {d: [] for d in [*LINE, LAB, *LIARS]}) as broker:
        operator = broker.connect(CLI_IDENTITY)
        watcher = FleetWatcher(operator, TOPICS)
        agents = []
        for device, group in [*((d, "line") for d in LINE), (LAB, "lab")]:
            tls = pki.tls(device)
            agents.append(AgentProcess(
                device, tmp / device, broker=broker.url, trust=root_pub, profile=PROFILE, groups=(group,),
                telemetry_interval=0.5, extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
            ).start())  # fmt: skip
        try:
            dashboard = {"http_port": 0}  # the flooded-dashboard attack
            with control_plane(broker.url, tmp, tls=pki.tls(HOST_IDENTITY), retained_sweep_s=2.0, **dashboard) as plane:
                store = plane.store
                wait_until("every agent in the store", lambda: {*LINE, LAB} <= set(store.device_ids()), 90)
                for device in LINE:
                    store.set_labels(device, enrolment_labels(PROFILE, ["line"]))
                store.set_labels(LAB, enrolment_labels(PROFILE, ["lab"]))
                manifests = {"1": publish(operator, store, bundles["1"])}
                deploy_group(store, "line", manifests["1"])
                deploy_group(store, "lab", manifests["1"])
                for device in [*LINE, LAB]:
                    watcher.serving(device, manifests["1"].bundle_id, timeout=120)
                with Traffic(operator, TOPICS, [*LINE, LAB]):
                    wait_until(
                        "telemetry", lambda: all(store.latest_telemetry().get((d, "default")) for d in [*LINE, LAB]), 60
                    )
                    yield Fleet(broker, plane, operator, watcher, bundles, manifests)
        finally:
            for agent in agents:
                agent.stop()
            operator.stop()


def _enrolled_liar(fleet: Fleet, device: str, group: str, liar: LyingDevice) -> LyingDevice:
    liar.start()
    wait_until(f"{device} in the store", lambda: fleet.plane.store.device(device), 30)
    fleet.plane.store.set_labels(device, enrolment_labels(PROFILE, [group]))
    return liar


def _signed_documents_name(fleet: Fleet, text: str) -> list[str]:
    """Where a string appears in what the host decided or signed: deployments, published desired, retained desired."""
    store = fleet.plane.store
    found = [f"deployment {d.scope}:{d.target}" for d in store.deployments() if text in (d.bundle_id, d.model_name)]
    found += [
        f"published {p.device_id} slot {slot}" for (_, slot), p in store.published().items() if p.bundle_id == text
    ]
    return found


def test_a_made_up_active_bundle_in_a_rolled_back_group_reaches_no_signed_document(
    fleet: Fleet, attack_ledger: AttackLedger
) -> None:
    liar = LyingDevice(fleet.broker, "ev-madeup")  # it never installs what it is asked: the wave times out
    with _enrolled_liar(fleet, "ev-madeup", "lab", liar):
        liar.say(active_bundle=MADE_UP, verified=True)
        wait_until(
            "the lie in the store", lambda: (r := fleet.plane.store.device("ev-madeup")) and r.running() == MADE_UP
        )
        doc = fleet.rollout("lab", "2", canary="2", timing={**TIMING, "install_timeout_s": 20.0})
        signed = [d for d in liar.desired if MADE_UP in (d.bundle_id, d.allow_downgrade_to, d.model_name)]
        named = _signed_documents_name(fleet, MADE_UP) + [f"a desired document it received: {d}" for d in signed]
        progress = doc.devices["ev-madeup"]
        ticks = fleet.engine_ticks()
        works, how = fleet.line_still_works()
    assert not attack_ledger.record(
        "a made-up active_bundle in a rolled-back group",
        bool(named) or not works or not ticks or doc.state not in ("rolled-back", "failed"),
        f"rollout {doc.state}; the liar {progress.state}: {progress.reason[:120]}; signed documents naming it: "
        f"{named or 'none'}; engine ticking: {ticks}; then {how}",
    )
    assert progress.state == "kept" and "which the store never published" in progress.reason
    assert doc.devices[LAB].state == "rolled-back", doc.devices[LAB]


def test_an_unenrolled_device_claiming_a_group_is_not_planned(fleet: Fleet, attack_ledger: AttackLedger) -> None:
    with LyingDevice(fleet.broker, "ev-claimer") as liar:
        liar.say(groups=("line",))
        wait_until("the claimer in the store", lambda: fleet.plane.store.device("ev-claimer"), 30)
        groups = {g["name"]: g for g in api_groups(fleet.plane.store)["groups"]}
        offered = "ev-claimer" in groups["line"]["rollout_members"]
        works, how = fleet.line_still_works()
        planned = any("ev-claimer" in load_doc(r).devices for r in fleet.plane.store.rollouts())
        told = [d.bundle_id for d in liar.desired if not d.clear]
    assert not attack_ledger.record(
        "an unenrolled device claiming a group (groups: [line])",
        offered or planned or bool(told) or not works,
        f"in the form's members: {offered}; planned: {planned}; desired sent to it: {told or 'none'}; {how}",
    )


def _fake_commit(liar: LyingDevice, desired: Desired) -> None:
    """Commit at once, fetch nothing; report a plausible latency and golden scores for the bundle's outputs."""
    names = liar.output_names(desired.bundle_id)
    scores = tuple(OutputScore(output=n, rule="class-agreement", score=1.0, passed=True) for n in names)
    liar.say(active_bundle=desired.bundle_id, verified=True, golden_scores=scores)
    liar.event("committed", desired.bundle_id, "now serving")


def test_a_fake_committed_canary_that_downloaded_nothing_does_not_pass(
    fleet: Fleet, attack_ledger: AttackLedger
) -> None:
    build = fleet.manifests["1"].latency
    assert build is not None
    liar = LyingDevice(fleet.broker, "ev-fake", on_desired=_fake_commit)
    liar.claims = Claims(p50_ms=build.median_ms * 1.5, p95_ms=build.median_ms * 2)
    with _enrolled_liar(fleet, "ev-fake", "fake", liar):
        doc = fleet.rollout("fake", "2")
        progress = doc.devices["ev-fake"]
        works, how = fleet.line_still_works()
    assert not attack_ledger.record(
        "a fake-committed canary with no download",
        progress.state == "passed" or doc.state == "succeeded" or not works,
        f"rollout {doc.state}; canary {progress.state}: {progress.reason[:160]}; {how}",
    )
    assert "implausible report: committed having fetched 0 bytes" in progress.reason, progress.reason


def _fast_commit(liar: LyingDevice, desired: Desired) -> None:
    """A consistent liar about the fetch (it claims the bundle's bytes) and the timing, but far too fast."""
    offer = liar.offer(desired.bundle_id)
    time.sleep(1.0)
    names = liar.output_names(desired.bundle_id)
    scores = tuple(OutputScore(output=n, rule="class-agreement", score=1.0, passed=True) for n in names)
    wire = sum(c.zstd or c.size for c in offer.transfer.chunks) if offer else 10**7
    liar.say(
        active_bundle=desired.bundle_id, verified=True, golden_scores=scores, bulk_bytes=liar.claims.bulk_bytes + wire
    )
    liar.event("committed", desired.bundle_id, "now serving")


def test_an_implausibly_fast_canary_does_not_pass(fleet: Fleet, attack_ledger: AttackLedger) -> None:
    build = fleet.manifests["1"].latency
    assert build is not None
    liar = LyingDevice(fleet.broker, "ev-fast", on_desired=_fast_commit)
    liar.claims = Claims(p50_ms=build.median_ms / 50, p95_ms=build.median_ms / 40)
    with _enrolled_liar(fleet, "ev-fast", "fast", liar):
        doc = fleet.rollout("fast", "2")
        progress = doc.devices["ev-fast"]
        works, how = fleet.line_still_works()
    assert not attack_ledger.record(
        f"an implausibly fast canary (p95 {build.median_ms / 40:.4f} ms for a {build.median_ms:.3f} ms build)",
        progress.state == "passed" or doc.state == "succeeded" or not works,
        f"rollout {doc.state}; canary {progress.state}: {progress.reason[:160]}; {how}",
    )
    assert "implausible report: " in progress.reason and "faster than the bundle's" in progress.reason


def test_a_flooded_dashboard_leaves_the_rollouts_of_the_fleet_working(
    fleet: Fleet, attack_ledger: AttackLedger
) -> None:
    """The dashboard of this control plane held by 1,200 idle connections and flooded with 100 failed logins while
    a valid rollout of the line group runs: the rollout succeeds, and an operator's request is answered."""
    assert fleet.plane.dashboard_url is not None
    host, port = fleet.plane.dashboard_url.removeprefix("http://").rstrip("/").split(":")
    token = issue_token(fleet.plane.store, "ops-flooded")
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": fleet.plane.dashboard_url.rstrip("/")}
    idle = [socket.create_connection((host, int(port))) for _ in range(1200)]
    try:
        logins: dict[int, int] = {}
        for i in range(100):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("POST", "/login", body=f"token=eft_guess-{i}", headers=form)
            status = conn.getresponse().status
            conn.close()
            logins[status] = logins.get(status, 0) + 1
        works, how = fleet.line_still_works()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/api/fleet", headers={"Authorization": f"Bearer {token}"})
        answered = conn.getresponse().status
        conn.close()
    finally:
        for sock in idle:
            sock.close()
    detail = f"logins {dict(sorted(logins.items()))}; {how}; an operator's request: {answered}"
    assert not attack_ledger.record(
        "the dashboard held by 1,200 idle connections and 100 failed logins during a rollout of another group",
        not works or answered != 200 or logins.get(429, 0) < 90, detail,
    ), detail  # fmt: skip
    assert fleet.engine_ticks()
