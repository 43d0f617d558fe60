"""A model new to a slot, on devices that run other models (issue 33), on a real SQLite store with the devices as
records (statuses, events, telemetry as ingestion writes them) and the test's clock: the rollout adds the slot
beside the detector; when the newcomer pushes the detector past its latency objective, the neighbour guardrail
fails the device and the rollback removes the new slot there (a signed removal), leaving the detector alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.rollout.engine import RolloutEngine, load_doc, make_spec, prepare_rollout
from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.plan import BundleRef, RolloutDoc
from edgefleet.control.store import ANY_PROFILE, BundleRecord, Store
from edgefleet.control.store.open import open_store
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, LinkReport, SlotStatus, Telemetry

PROFILE = "generic-x86-64"
DEVICE = "cam-0"
LM = BundleRef(bundle_id="lm-2-generic-x86-64", model_name="lm", model_version="2", profile=PROFILE)
LM_FACTS = BundleFacts(bundle_id=LM.bundle_id, profile=PROFILE, size=1200, wire_bytes=1000)
DETECTOR = SlotStatus(slot="detector", state="serving", active_bundle="det-1", active_model="det@1", verified=True,
                      slot_class="real-time", latency_objective_ms=30.0)  # fmt: skip
TIMING = {"baseline_s": 0.0, "observe_s": 5.0, "install_timeout_s": 60.0, "report_timeout_s": 5.0, "min_reports": 2}


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


def report(seq: int, ts: float, slot: str, bundle: str, p95: float, bulk: int = 0) -> Telemetry:
    return Telemetry(
        device_id=DEVICE, seq=seq, ts=ts, slot=slot, bundle_id=bundle, provider="cpu", window_s=1.0, requests=50,
        errors=0, throughput_rps=50.0, latency=LatencySummary(count=50, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95),
        golden_agreement=1.0, golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=10.0,
        link=LinkReport(bulk_bytes=bulk, clock_s=ts - 999_000.0),
    )  # fmt: skip


def status(store: Store, clock: Clock, *slots: SlotStatus) -> None:
    store.upsert_statuses(
        [DeviceStatus(device_id=DEVICE, online=True, state="serving", profile=PROFILE, slots=list(slots))], clock.now
    )


def test_a_new_slot_that_starves_the_detector_is_rolled_back_by_removing_it(store: Store) -> None:
    clock = Clock()
    store.put_bundle(BundleRecord(LM.bundle_id, "lm", "2", PROFILE, 1200, 0.01, 0.0))
    store.put_bundle_facts(LM.bundle_id, LM_FACTS.model_dump_json(), clock.now)
    status(store, clock, DETECTOR)
    store.set_labels(DEVICE, enrolment_labels(PROFILE, ["cams"]))
    store.add_telemetry([report(i, clock.now - 30 + i, "detector", "det-1", 20.0) for i in range(1, 20)], clock.now)
    spec = make_spec(group="cams", slot="assistant", bundles=[LM], canary="1", waves=["100%"], timing=TIMING,
                     allow_unjudged=["latency", "golden", "errors"])  # fmt: skip
    rollout_id = prepare_rollout(store, spec, now=clock.now).id
    engine = RolloutEngine(store, None, clock=clock)

    def doc() -> RolloutDoc:
        return load_doc(store.rollout(rollout_id))  # type: ignore[arg-type]

    engine.tick()  # baseline (nothing to measure: the slot is empty) -> deploying
    assert [(d.slot, d.bundle_id) for d in store.deployments()] == [("assistant", LM.bundle_id)]
    clock.now += 1
    status(store, clock, DETECTOR, SlotStatus(slot="assistant", state="serving", active_bundle=LM.bundle_id,
                                              active_model="lm@2", verified=True))  # fmt: skip
    store.add_events([Event(device_id=DEVICE, kind="committed", seq=30, ts=clock.now, slot="assistant",
                            bundle_id=LM.bundle_id)], clock.now)  # fmt: skip
    engine.tick()  # deploying -> observing
    assert doc().devices[DEVICE].state == "installed", doc().log
    for step in range(1, 4):
        clock.now += 1
        store.add_telemetry([
            report(40 + 2 * step, clock.now, "assistant", LM.bundle_id, 300.0, bulk=LM_FACTS.wire_bytes),
            report(41 + 2 * step, clock.now, "detector", "det-1", 45.0),
        ], clock.now)  # fmt: skip
        engine.tick()
    progress = doc().devices[DEVICE]
    assert "slot detector p95 45 ms > objective 30 ms since assistant v2 arrived" in progress.reason, doc().log
    assert "slot assistant was new on the device: it is removed" in progress.reason
    assert doc().state == "rolling-back" and progress.state == "rolling-back"
    (removal,) = store.deployments()
    assert (removal.slot, removal.remove, removal.profile, removal.target) == ("assistant", True, ANY_PROFILE, DEVICE)
    clock.now += 1
    status(store, clock, DETECTOR)  # the device unloaded the slot; the detector never moved
    engine.tick()
    assert doc().state == "rolled-back" and doc().devices[DEVICE].state == "rolled-back", doc().log
