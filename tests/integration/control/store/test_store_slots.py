"""Several models per device in the store (issue 33): desired state, what was published, device statuses and
reports are kept per (device, slot), and a store from before slots is migrated so that everything it held belongs
to slot "default" (migration 0011_slots, on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from edgefleet.control.store import Deployment, PublishedDesired, SlotPolicy, Store, open_store
from edgefleet.control.store.sql.migrate import VERSION_TABLE, migrations
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, SlotStatus, Telemetry

SLOTS_VERSION = 11  # 0011_slots.sql


@contextmanager
def _raw(url: str) -> Iterator[Callable[[str, tuple[Any, ...]], None]]:
    """A plain connection to the store's database (no edgefleet code in between), committed at the end."""
    if url.startswith("sqlite://"):
        db = sqlite3.connect(url[len("sqlite://") :])
        yield lambda sql, params=(): db.execute(sql, params) and None
        db.commit()
        db.close()
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            yield lambda sql, params=(): conn.execute(sql.replace("?", "%s"), params) and None  # type: ignore[arg-type]


def _store_before_slots(url: str) -> None:
    """A store at version 10 (the last single-model schema) holding a device, its deployment, what was published
    for it and its latest report, as a control plane before slots wrote them."""
    dialect = "sqlite" if url.startswith("sqlite://") else "postgresql"
    with _raw(url) as execute:
        execute(VERSION_TABLE, ())
        for step in migrations(dialect)[: SLOTS_VERSION - 1]:
            for statement in step.statements:
                execute(statement, ())
            execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                (step.version, step.name, 0.0),
            )
        execute(
            "INSERT INTO devices (device_id, online, state, profile, groups_json, labels_json, agent_version,"
            " active_bundle, active_model, provider, verified, status_ts, first_seen)"
            " VALUES ('d1', 1, 'serving', 'p', '[\"g\"]', '{}', '0.1.0', 'b1', 'm@1', 'CPUExecutionProvider', 1, 5.0,"
            " 1.0)",
            (),
        )
        execute(
            "INSERT INTO deployments (scope, target, profile, bundle_id, model_name, model_version, rollback, source,"
            " updated_at) VALUES ('group', 'g', 'p', 'b1', 'm', '1', 0, 'operator', 2.0)",
            (),
        )
        execute("INSERT INTO published (device_id, bundle_id, rollback, issued_at) VALUES ('d1', 'b1', 0, 3.0)", ())
        execute(
            "INSERT INTO latest_telemetry (device_id, seq, ts, bundle_id, requests, errors, p95_ms, latency_count,"
            " cpu_percent, rss_mb, received_at) VALUES ('d1', 4, 4.0, 'b1', 10, 0, 7.5, 10, 1.0, 50.0, 4.0)",
            (),
        )


def test_a_store_from_before_slots_keeps_everything_in_the_default_slot(store_url: str) -> None:
    _store_before_slots(store_url)
    store = open_store(store_url)  # migrates 10 -> 11
    try:
        device = store.device("d1")
        assert device is not None and [s.slot for s in device.slots] == ["default"]
        slot = device.slot("default")
        assert slot is not None and slot.active_bundle == "b1" and slot.active_model == "m@1" and slot.verified
        assert slot.provider_in_use == "CPUExecutionProvider", "the single model's status moved into its slot"
        assert store.deployments() == [Deployment("group", "g", "p", "b1", "m", "1", False, "operator", 2.0)]
        assert store.deployments()[0].slot == "default"
        assert store.published() == {("d1", "default"): PublishedDesired("d1", "b1", False, 3.0)}
        assert store.latest_telemetry()[("d1", "default")].p95_ms == 7.5
        # The new key holds: a second slot of the same target is a second row.
        store.put_deployment(Deployment("group", "g", "p", "b9", "lm", "2", slot="assistant"))
        assert {(d.slot, d.bundle_id) for d in store.deployments()} == {("default", "b1"), ("assistant", "b9")}
    finally:
        store.close()


def _status(*slots: SlotStatus, online: bool = True) -> DeviceStatus:
    return DeviceStatus(device_id="d1", online=online, state="serving" if online else "offline", profile="p",
                        slots=list(slots))  # fmt: skip


def test_each_slot_of_a_device_is_kept_with_its_own_deployments_publications_and_reports(store: Store) -> None:
    detector = SlotStatus(slot="detector", state="serving", active_bundle="det-1", verified=True, memory_mb=120.0,
                          slot_class="real-time", latency_objective_ms=30.0)  # fmt: skip
    assistant = SlotStatus(slot="assistant", state="serving", active_bundle="lm-1", verified=True)
    store.upsert_statuses([_status(detector, assistant)], time.time())
    store.upsert_statuses([_status(online=False)], time.time())  # the last will names no slot: keep what ran
    device = store.device("d1")
    assert device is not None and device.slot("detector") == detector and device.running("assistant") == "lm-1"
    assert device.running() is None, "no default slot on this device"

    store.put_deployment(Deployment("device", "d1", "p", "det-1", "det", "1", slot="detector"))
    store.put_deployment(Deployment("device", "d1", "p", "lm-1", "lm", "1", slot="assistant"))
    assert store.delete_deployment("device", "d1", slot="assistant") == 1
    assert [d.slot for d in store.deployments()] == ["detector"], "deleting one slot's deployment keeps the other"

    store.set_published_many([
        (("d1", "detector"), PublishedDesired("d1", "det-1", False, 1.0, slot="detector")),
        (("d1", "assistant"), PublishedDesired("d1", "", False, 1.0, slot="assistant", remove=True)),
    ])  # fmt: skip
    store.set_published(("d1", "detector"), None)
    assert list(store.published()) == [("d1", "assistant")] and store.published()[("d1", "assistant")].remove

    def report(seq: int, slot: str, p95: float) -> Telemetry:
        return Telemetry(
            device_id="d1", seq=seq, ts=time.time(), slot=slot, bundle_id=f"{slot}-b", provider="cpu", window_s=1.0,
            requests=5, errors=0, throughput_rps=5.0, latency=LatencySummary(count=5, p50_ms=p95, p95_ms=p95,
            p99_ms=p95), golden_agreement=None, golden_max_abs_error=None, cpu_percent=1.0, rss_mb=10.0,
        )  # fmt: skip

    store.add_telemetry([report(1, "detector", 20.0), report(2, "assistant", 200.0)], time.time())
    assert [p.p95_ms for p in store.telemetry("d1", 0.0, slot="detector")] == [20.0]
    assert {k: p.p95_ms for k, p in store.latest_telemetry().items()} == {
        ("d1", "detector"): 20.0, ("d1", "assistant"): 200.0,
    }  # fmt: skip
    store.add_events([Event(device_id="d1", kind="refused", seq=3, slot="assistant", detail="over the budget")], 1.0)
    assert [(e.kind, e.slot) for e in store.events(device_id="d1")] == [("refused", "assistant")]
    assert json.loads(json.dumps([s.model_dump(mode="json") for s in device.slots]))[0]["slot"] == "detector"


def test_a_slots_policy_is_kept_per_target_and_what_was_published_remembers_it(store: Store) -> None:
    store.put_slot_policy(SlotPolicy("group", "line", "detector", "real-time", 30.0, updated_at=1.0))
    store.put_slot_policy(SlotPolicy("group", "line", "detector", "real-time", 25.0, updated_at=2.0))  # replaces
    store.put_slot_policy(SlotPolicy("device", "d1", "assistant", "batch", updated_at=3.0))
    assert store.slot_policies() == [
        SlotPolicy("device", "d1", "assistant", "batch", None, 3.0),
        SlotPolicy("group", "line", "detector", "real-time", 25.0, 2.0),
    ]
    assert store.delete_slot_policy("device", "d1", "assistant") == 1
    assert store.delete_slot_policy("device", "d1", "assistant") == 0
    sent = PublishedDesired("d1", "det-1", False, 1.0, slot="detector", slot_class="real-time",
                            latency_objective_ms=25.0)  # fmt: skip
    store.set_published(("d1", "detector"), sent)
    assert store.published()[("d1", "detector")] == sent
