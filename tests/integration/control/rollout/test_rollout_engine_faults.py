"""Fault isolation in the rollout engine (issue 20 item 2), on a real SQLite store: one bad record fails its own
step with a reason, never the tick; the engine says how it is doing.

The devices here are records in the store (statuses, events, telemetry written as ingestion writes them), the
clock is the test's: the engine's bookkeeping is under test, not the fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.rollout.engine import MAX_STEP_FAILURES, RolloutEngine, load_doc, make_spec, prepare_rollout
from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.plan import BundleRef
from edgefleet.control.store import BundleRecord, RolloutRow, Store
from edgefleet.control.store.open import open_store
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, LinkReport, SlotStatus, Telemetry

PROFILE = "generic-x86-64"
V1 = BundleRecord("m-1-generic-x86-64", "m", "1", PROFILE, 1000, 0.01, 0.0)
V2 = BundleRef(bundle_id="m-2-generic-x86-64", model_name="m", model_version="2", profile=PROFILE)
# What the host recorded when it published V2, which the devices' reports are weighed against (judge/plausibility.py)
V2_FACTS = BundleFacts(bundle_id=V2.bundle_id, profile=PROFILE, size=1200, wire_bytes=1000)
TIMING = {"baseline_s": 0.0, "observe_s": 5.0, "install_timeout_s": 60.0, "report_timeout_s": 5.0, "min_reports": 1}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite://{tmp_path}/control.sqlite")
    yield s
    s.close()


def devices(store: Store, clock: Clock, group: str, ids: list[str], bundle: str = V1.bundle_id) -> None:
    store.put_bundle(V1)
    store.put_bundle_facts(V2.bundle_id, V2_FACTS.model_dump_json(), clock.now)
    # their link counters before the rollout: nothing fetched yet
    idle = LatencySummary(count=0, p50_ms=None, p95_ms=None, p99_ms=None)
    before = [
        Telemetry(device_id=d, seq=1, ts=clock.now - 1, bundle_id=bundle, provider="cpu", window_s=1.0, requests=0,
                  errors=0, throughput_rps=0.0, latency=idle, golden_agreement=None, golden_max_abs_error=None,
                  cpu_percent=1.0, rss_mb=10.0, link=LinkReport(clock_s=10.0))
        for d in ids
    ]  # fmt: skip
    store.add_telemetry(before, clock.now - 1)
    serving = SlotStatus(slot="default", state="serving", active_bundle=bundle, active_model="m@1", verified=True)
    statuses = [DeviceStatus(device_id=d, online=True, state="serving", profile=PROFILE, slots=[serving])
                for d in ids]  # fmt: skip
    store.upsert_statuses(statuses, clock.now)
    store.add_events([Event(device_id=d, kind="committed", seq=1, ts=clock.now, bundle_id=bundle) for d in ids],
                     clock.now)  # fmt: skip
    for d in ids:
        store.set_labels(d, enrolment_labels(PROFILE, [group]))


def start(store: Store, group: str, **changes: Any) -> str:
    fields: dict[str, Any] = {"group": group, "bundles": [V2], "canary": "1", "waves": ["100%"], "timing": TIMING,
                              "allow_unjudged": ["latency", "golden", "errors"]}  # fmt: skip
    fields.update(changes)
    return prepare_rollout(store, make_spec(**fields)).id


def test_a_rollout_whose_step_raises_fails_that_step_and_the_others_go_on(store: Store) -> None:
    clock = Clock()
    devices(store, clock, "good", ["g-0", "g-1"])
    devices(store, clock, "bad", ["b-0"])
    good, bad = start(store, "good"), start(store, "bad")
    row = store.rollout(bad)
    assert row is not None
    broken = load_doc(row)
    broken.state, broken.current_wave = "running", 7  # a record no step can handle (another version, or by hand)
    store.save_rollout(RolloutRow(bad, broken.state, broken.model_dump_json(), row.created_at, row.updated_at))
    engine = RolloutEngine(store, None, clock=clock)
    engine.tick()
    doc = load_doc(store.rollout(good))  # type: ignore[arg-type]
    assert doc.state == "running" and doc.waves[0].state == "deploying", doc.log
    failed = load_doc(store.rollout(bad))  # type: ignore[arg-type]
    assert failed.step_failures == 1 and "IndexError" in failed.step_error
    assert any(e.message.startswith("step failed (it is retried next tick): IndexError") for e in failed.log)
    health = engine.health.snapshot(clock.now)
    assert health.last_tick == clock.now and health.errors_per_min == 1 and bad in health.last_error
    for _ in range(MAX_STEP_FAILURES):
        clock.now += 1
        engine.tick()
    failed = load_doc(store.rollout(bad))  # type: ignore[arg-type]
    assert failed.state == "paused" and "failed 10 times in a row" in failed.log[-1].message
    assert sum(1 for e in failed.log if e.message.startswith("step failed")) == 1, "one note, not one per tick"
    assert engine.health.snapshot(clock.now).last_tick == clock.now, "the engine kept ticking"


class FaultyStore:
    """The real store, except that one device's telemetry cannot be read (a fault a real store rarely shows on
    demand: a corrupt row, a decoding bug)."""

    def __init__(self, store: Store, broken: str) -> None:
        self._store, self._broken = store, broken

    def telemetry(self, device_id: str, *args: Any, **kwargs: Any) -> Any:
        if device_id == self._broken:
            raise ValueError(f"corrupt telemetry row for {device_id}")
        return self._store.telemetry(device_id, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_device_whose_records_cannot_be_read_fails_alone_with_the_reason(store: Store) -> None:
    clock = Clock()
    devices(store, clock, "line", ["l-0", "l-1", "l-2"])
    rollout_id = start(store, "line", canary="3", max_failed_devices=1)
    engine = RolloutEngine(FaultyStore(store, "l-1"), None, clock=clock)  # type: ignore[arg-type]
    engine.tick()  # baseline → deploying
    clock.now += 1
    for d in ("l-0", "l-1", "l-2"):  # they install v2 and report on it
        serving = SlotStatus(slot="default", state="serving", active_bundle=V2.bundle_id, active_model="m@2",
                             verified=True)  # fmt: skip
        store.upsert_statuses([DeviceStatus(device_id=d, online=True, state="serving", profile=PROFILE,
                                            slots=[serving])], clock.now)  # fmt: skip
        store.add_events([Event(device_id=d, kind="committed", seq=2, ts=clock.now, bundle_id=V2.bundle_id)],
                         clock.now)  # fmt: skip
    engine.tick()  # deploying → observing
    for step in range(1, 12):
        clock.now += 1
        store.add_telemetry([
            Telemetry(device_id=d, seq=10 + step, ts=clock.now, bundle_id=V2.bundle_id, provider="cpu", window_s=1.0,
                      requests=50, errors=0, throughput_rps=50.0,
                      latency=LatencySummary(count=500, p50_ms=1.0, p95_ms=1.2, p99_ms=1.5), golden_agreement=1.0,
                      golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=10.0,
                      link=LinkReport(bulk_bytes=V2_FACTS.wire_bytes, clock_s=10.0 + step))
            for d in ("l-0", "l-1", "l-2")
        ], clock.now)  # fmt: skip
        engine.tick()
    doc = load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]
    broken = doc.devices["l-1"]
    assert broken.state == "failed", broken
    assert broken.reason == "the control plane could not judge it: ValueError: corrupt telemetry row for l-1"
    assert {doc.devices[d].state for d in ("l-0", "l-2")} != {"failed"}, "the other devices were judged"
    assert engine.health.snapshot(clock.now).errors_per_min >= 1
