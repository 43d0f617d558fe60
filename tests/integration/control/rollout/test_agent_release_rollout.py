"""An agent-release rollout driven by the real engine on a real SQLite store, the devices as records (statuses,
events, telemetry as ingestion writes them) and the test's clock: each wave's devices are named the release in the
store (what the desired publisher signs into their documents), a canary that commits it and whose model keeps its
latency passes and the next wave is named it; a canary whose launcher rolls the release back stops the rollout with
its own reason, the other device never named it; a canary whose model gets slower under the new agent fails the wave
with the latency figure and is named its previous release again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.rollout.engine import RolloutEngine, load_doc, make_spec, prepare_rollout
from edgefleet.control.rollout.plan import AgentReleaseRef, RolloutDoc
from edgefleet.control.store import AgentReleaseTarget, Store
from edgefleet.control.store.open import open_store
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, SlotStatus, Telemetry

PROFILE = "generic-x86-64"
DEVICES = ("dc-1", "dc-2")
BUNDLE = "digits-1-generic-x86-64"
V2 = AgentReleaseRef(release_id="edgefleet-agent-0.2.0-aaa", version="0.2.0")
V3 = AgentReleaseRef(release_id="edgefleet-agent-0.3.0-bbb", version="0.3.0")
TIMING = {"baseline_s": 20.0, "observe_s": 5.0, "install_timeout_s": 60.0, "report_timeout_s": 5.0, "min_reports": 2}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """The devices' side, written into the store as ingestion would."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store, self.clock = store, clock
        self.seq = dict.fromkeys(DEVICES, 0)
        self.agent = dict.fromkeys(DEVICES, "0.1.0")

    def _next(self, device: str) -> int:
        self.seq[device] += 1
        return self.seq[device]

    def status(self, device: str) -> None:
        slot = SlotStatus(slot="default", state="serving", active_bundle=BUNDLE, active_model="digits@1", verified=True)
        status = DeviceStatus(
            device_id=device, online=True, state="serving", profile=PROFILE, ts=self.clock.now,
            agent_version=self.agent[device], slots=[slot],
        )  # fmt: skip
        self.store.upsert_statuses([status], self.clock.now)

    def serve(self, device: str, p95_ms: float, seconds: int = 10) -> None:
        """A report a second over the last `seconds`: 400 requests each at that p95."""
        now = self.clock.now
        reports = [
            Telemetry(
                device_id=device, seq=self._next(device), ts=now - seconds + i + 1, bundle_id=BUNDLE, provider="cpu",
                window_s=1.0, requests=400, errors=0, throughput_rps=400.0,
                latency=LatencySummary(count=400, p50_ms=p95_ms * 0.8, p95_ms=p95_ms, p99_ms=p95_ms * 1.1),
                golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=10.0,
            )
            for i in range(seconds)
        ]  # fmt: skip
        self.store.add_telemetry(reports, now)

    def launcher(self, device: str, release: AgentReleaseRef, committed: bool, reason: str) -> None:
        """The device's launcher decided: its event, and (committed) the new agent's own status."""
        verb = "committed" if committed else "rolled back"
        event = Event(
            device_id=device, seq=self._next(device), ts=self.clock.now,
            kind="agent-committed" if committed else "agent-rolled-back",
            detail=f"{release.release_id} (agent {release.version}) {verb}: {reason}",
        )  # fmt: skip
        self.store.add_events([event], self.clock.now)
        if committed:
            self.agent[device] = release.version
        self.status(device)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite://{tmp_path}/control.sqlite")
    yield s
    s.close()


def start(store: Store, clock: Clock, release: AgentReleaseRef) -> tuple[Fleet, RolloutEngine, str]:
    fleet = Fleet(store, clock)
    for device in DEVICES:
        fleet.status(device)
        store.set_labels(device, enrolment_labels(PROFILE, ["line"]))
        fleet.serve(device, p95_ms=2.0, seconds=20)
    spec = make_spec(group="line", agent_release=release, canary="1", waves=["100%"], timing=TIMING)
    rollout = prepare_rollout(store, spec, now=clock.now)
    assert rollout.id.startswith("line-agent-v")
    return fleet, RolloutEngine(store, None, clock=clock), rollout.id


def named(store: Store) -> dict[str, str]:
    return {device: target.release_id for device, target in store.agent_releases().items()}


def test_a_release_the_canary_commits_with_healthy_models_goes_to_the_next_wave_and_succeeds(store: Store) -> None:
    clock = Clock()
    fleet, engine, rollout_id = start(store, clock, V2)

    def doc() -> RolloutDoc:
        return load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]

    engine.tick()  # the canary's baseline (its 20 reports on the bundle) -> deploying
    (canary,) = doc().waves[0].devices
    (other,) = doc().waves[1].devices
    assert named(store) == {canary: V2.release_id}, "only the canary is named the release"
    baseline = doc().devices[canary].baseline
    assert baseline is not None and baseline.p95_ms == 2.0, "its own p95 on the bundle before the release"
    clock.now += 30
    fleet.launcher(canary, V2, True, "passed its health gate")
    engine.tick()
    assert doc().devices[canary].state == "installed", doc().log
    for _ in range(2):
        clock.now += 6
        fleet.serve(canary, p95_ms=2.1, seconds=6)
        fleet.serve(other, p95_ms=2.0, seconds=6)
        engine.tick()
    assert doc().devices[canary].state == "passed", doc().log
    assert named(store) == {canary: V2.release_id, other: V2.release_id}, "the next wave is named it"
    clock.now += 30
    fleet.launcher(other, V2, True, "passed its health gate")
    engine.tick()
    for _ in range(2):
        clock.now += 6
        fleet.serve(other, p95_ms=2.0, seconds=6)
        engine.tick()
    assert doc().state == "succeeded", doc().log
    assert doc().outcome == "all 2 waves passed; line runs agent 0.2.0"


def test_a_release_the_canarys_launcher_rolls_back_stops_the_rollout_with_its_reason(store: Store) -> None:
    clock = Clock()
    fleet, engine, rollout_id = start(store, clock, V3)
    engine.tick()
    rollout = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    (canary,) = rollout.waves[0].devices
    clock.now += 30
    why = "the new agent exited with code 1 before passing its health gate: RuntimeError: broken on purpose"
    fleet.launcher(canary, V3, False, why)
    engine.tick()
    rollout = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    assert rollout.state == "rolled-back", rollout.log
    assert rollout.outcome.startswith(f"wave 0 failed: {canary} failed: agent-rolled-back: {V3.release_id}")
    assert why in rollout.outcome
    assert rollout.devices[canary].state == "rolled-back" and "runs agent 0.1.0" in rollout.devices[canary].reason
    assert named(store) == {}, "no device is named the broken release; the other was never named it"
    assert rollout.waves[1].state == "pending"


def test_a_release_that_slows_the_canarys_model_fails_the_wave_and_names_its_previous_release(store: Store) -> None:
    clock = Clock()
    store.put_agent_release(AgentReleaseTarget("dc-1", V2.release_id, "0.2.0", source="rollout:before"))
    store.put_agent_release(AgentReleaseTarget("dc-2", V2.release_id, "0.2.0", source="rollout:before"))
    fleet, engine, rollout_id = start(store, clock, V3)
    fleet.agent.update(dict.fromkeys(DEVICES, "0.2.0"))
    for device in DEVICES:
        fleet.status(device)
    engine.tick()
    rollout = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    (canary,) = rollout.waves[0].devices
    (other,) = rollout.waves[1].devices
    clock.now += 30
    fleet.launcher(canary, V3, True, "passed its health gate")
    engine.tick()
    for _ in range(2):
        clock.now += 6
        fleet.serve(canary, p95_ms=9.0, seconds=6)  # 4.5x its own p95 under 0.2.0
        engine.tick()
    rollout = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    assert rollout.outcome.startswith(f"wave 0 failed: {canary} failed: after agent 0.3.0 committed: "), rollout.log
    assert "latency" in [f.criterion for f in rollout.devices[canary].findings if f.ok is False]
    assert rollout.state == "rolling-back" and rollout.devices[canary].state == "rolling-back"
    target = store.agent_releases()[canary]
    assert (target.release_id, target.allow_downgrade_to) == (V2.release_id, V2.release_id), "a signed downgrade"
    assert named(store)[other] == V2.release_id, "the other device was never named 0.3.0"
    clock.now += 30
    fleet.agent[canary] = "0.2.0"  # its launcher went back to 0.2.0
    fleet.status(canary)
    engine.tick()
    rollout = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    assert rollout.state == "rolled-back" and rollout.devices[canary].state == "rolled-back", rollout.log
