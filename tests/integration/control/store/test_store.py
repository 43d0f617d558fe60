"""The store behind its URL, on both backends (SQLite and a real PostgreSQL): dedup, retention and downsampling,
rollouts, leases with fencing tokens, migrations, shared by processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from edgefleet.control.store import (
    WRITE_MS_COUNTER,
    BundleRecord,
    Deployment,
    Fence,
    FencedOut,
    GroupDef,
    PublishedDesired,
    RolloutRow,
    Store,
    StoreError,
    open_store,
    write_ms_quantile,
)
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.messages import (
    DeviceStatus,
    Event,
    GenerationStats,
    Hardware,
    LatencySummary,
    SlotStatus,
    Telemetry,
)


def status(device: str, *, online: bool = True, bundle: str | None = "b1", ts: float = 1000.0) -> DeviceStatus:
    return DeviceStatus(
        device_id=device, online=online, state="serving" if online else "offline", ts=ts, profile="p",
        groups=["line-1"], hardware=Hardware(arch="x86_64", os="linux", cpu_count=2, memory_mb=1, hostname="h"),
        slots=[SlotStatus(slot="default", state="serving", active_bundle=bundle, active_model="m@1",
                          verified=True)] if online and bundle else [],
    )  # fmt: skip


def telemetry(
    device: str, seq: int, ts: float, *, p95: float = 1.0, golden: float = 1.0, bundle: str = "b1"
) -> Telemetry:
    return Telemetry(
        device_id=device, seq=seq, ts=ts, bundle_id=bundle, provider="cpu", window_s=1.0, requests=10, errors=1,
        throughput_rps=10.0, latency=LatencySummary(count=10, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95),
        golden_agreement=golden, golden_max_abs_error=0.0, cpu_percent=5.0, rss_mb=50.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://x/y", "unknown store URL scheme 'mysql'"),
        ("postgresql://127.0.0.1:1/edgefleet", "cannot open the store postgresql://127.0.0.1:1/edgefleet"),
        ("sqlite://", "names no file"),
        ("sqlite:///:memory:", "names no file"),
    ],
)
def test_store_urls_are_checked(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        open_store(url)


def test_plain_paths_and_sqlite_urls_open_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "s.sqlite"
    a = open_store(str(path))
    a.upsert_statuses([status("d1")], 1.0)
    b = open_store(f"sqlite://{path}")
    assert b.device_ids() == {"d1"}
    a.close()
    b.close()


def test_repeated_reports_are_stored_once(store: Store) -> None:
    reports = [telemetry("d1", seq, 1000.0 + seq) for seq in range(1, 6)]
    assert store.add_telemetry(reports, 2000.0) == 5
    assert store.add_telemetry([*reports[2:], telemetry("d1", 6, 1006.0)], 2001.0) == 1, "QoS 1 re-deliveries"
    assert store.telemetry_count("d1") == 6
    # A device whose counter restarted (state wiped) sends seq 1 again, with a new timestamp: kept.
    assert store.add_telemetry([telemetry("d1", 1, 5000.0)], 5001.0) == 1
    events = [Event(device_id="d1", kind="committed", seq=7, ts=1007.0, bundle_id="b1")]
    assert store.add_events(events, 2000.0) == 1
    assert store.add_events(events, 2000.0) == 0
    assert [e.kind for e in store.events(device_id="d1")] == ["committed"]


def test_what_is_stored_is_the_highest_contiguous_sequence_across_telemetry_events_and_instances(
    store: Store,
) -> None:
    """`stored_through` (what the control plane acknowledges as `StoredUpTo`): only a run without a gap counts, a
    gap is filled from what any instance stored, a `reports-dropped` announcement moves past numbers that will
    never come, and the number never goes back."""
    store.add_telemetry([telemetry("d1", n, 1000.0 + n) for n in (1, 2, 4)], 2000.0)
    assert store.stored_through({"d1": [1, 2, 4]}, {}, 2000.0) == {"d1": 2}, "4 waits for 3"
    store.add_events([Event(device_id="d1", kind="committed", seq=3, ts=1003.0, bundle_id="b1")], 2001.0)
    # another instance stored 3 (an event); this one hears only 5: the store fills the gap
    store.add_telemetry([telemetry("d1", 5, 1005.0)], 2002.0)
    assert store.stored_through({"d1": [5]}, {}, 2002.0) == {"d1": 5}
    assert store.stored_through({"d1": [5, 4]}, {}, 2003.0) == {}, "repeats move nothing"
    # the device's full spool dropped 6..9: its reports-dropped event (seq 10) says so
    assert store.stored_through({"d1": [10]}, {"d1": 9}, 2004.0) == {"d1": 10}
    assert store.stored_through({"d2": [2, 3]}, {}, 2005.0) == {}, "a device whose first report is missing waits"
    assert store.stored_through({"d1": [1]}, {}, 2006.0) == {}, "never backwards"


def test_reports_without_a_sequence_are_never_deduplicated(store: Store) -> None:
    report = telemetry("d1", 0, 1000.0)
    assert store.add_telemetry([report, report], 1.0) == 2


def test_latest_telemetry_keeps_the_newest_per_device_and_slot(store: Store) -> None:
    store.add_telemetry([telemetry("d1", 2, 1002.0, p95=2.0), telemetry("d2", 1, 1001.0)], 1.0)
    store.add_telemetry([telemetry("d1", 1, 1001.0, p95=1.0)], 2.0)  # late, older
    store.add_telemetry([telemetry("d1", 3, 1000.0, p95=9.0).model_copy(update={"slot": "assistant"})], 3.0)
    latest = store.latest_telemetry()
    assert latest[("d1", "default")].p95_ms == 2.0 and latest[("d1", "default")].seq == 2
    assert latest[("d1", "assistant")].p95_ms == 9.0, "another slot's report never hides the default slot's"
    assert set(latest) == {("d1", "default"), ("d1", "assistant"), ("d2", "default")}
    assert [p.seq for p in store.telemetry("d1", 0.0, slot="assistant")] == [3]
    assert [p.seq for p in store.telemetry("d1", 0.0, slot="default")] == [1, 2]


def test_a_language_models_token_figures_are_stored_with_its_report(store: Store) -> None:
    store.upsert_statuses([status("d1")], 1.0)
    generation = GenerationStats(
        streams=4, refused=1, cut=0, prompt_tokens=256, output_tokens=128, tokens_per_s=900.0,
        ttft=LatencySummary(count=4, p50_ms=3.5, p95_ms=5.0, p99_ms=5.0),
        tpot=LatencySummary(count=4, p50_ms=1.1, p95_ms=1.3, p99_ms=1.3),
    )  # fmt: skip
    store.add_telemetry([telemetry("d1", 1, 1001.0).model_copy(update={"generation": generation})], 1.0)
    store.add_telemetry([telemetry("d1", 1, 1001.0).model_copy(update={"generation": generation})], 2.0)  # a repeat
    assert store.latest_quality()[("d1", "default")].generation == generation
    assert [q.generation for q in store.quality("d1", 0.0)] == [generation]


def test_statuses_update_the_registry_and_the_last_will_keeps_the_bundle(store: Store) -> None:
    store.upsert_statuses([status("d1", ts=1000.0)], 1000.5)
    store.upsert_statuses([status("d1", online=False, ts=900.0)], 1100.0)  # a will built when the agent started
    device = store.device("d1")
    assert device is not None
    assert not device.online and device.state == "offline"
    assert device.running() == "b1", "the will says nothing about the slots: keep the last known"
    assert device.status_ts == 1100.0 and device.first_seen == 1000.5
    assert device.arch == "x86_64" and device.groups == ("line-1",)


def test_labels_are_edited_and_an_unknown_device_names_the_known_ones(store: Store) -> None:
    store.upsert_statuses([status("d1")], 1.0)
    assert dict(store.set_labels("d1", {"site": "berlin", "rack": "3"}).labels) == {"rack": "3", "site": "berlin"}
    assert dict(store.set_labels("d1", {}, ["rack"]).labels) == {"site": "berlin"}
    store.upsert_statuses([status("d1", ts=2000.0)], 2.0)
    record = store.device("d1")
    assert record is not None and dict(record.labels) == {"site": "berlin"}, "a new status keeps operator labels"
    with pytest.raises(UnknownNameError, match="unknown device 'd9'; valid: d1"):
        store.set_labels("d9", {"a": "b"})


def test_series_averages_per_step(store: Store) -> None:
    store.add_telemetry([telemetry("d1", i, 1000.0 + i, p95=float(i)) for i in range(1, 11)], 1.0)
    series = store.series("d1", 1000.0, 1020.0, 5.0)
    assert [p.ts for p in series] == [1000.0, 1005.0, 1010.0]
    assert [p.p95_ms for p in series] == [2.5, 7.0, 10.0]
    assert [p.reports for p in series] == [4, 5, 1] and series[0].requests == 40


def test_compaction_downsamples_old_reports_and_drops_what_is_too_old(store: Store) -> None:
    # 3 minutes of reports, one per 10 s; keep 60 s raw in 60 s buckets.
    store.add_telemetry([telemetry("d1", i, 1200.0 + 10 * i, p95=float(i), golden=0.5 + i / 100) for i in range(18)], 1)
    store.add_events([Event(device_id="d1", kind="committed", seq=99, ts=100.0)], 1.0)
    before = store.series("d1", 1200.0, 1380.0, 60.0)
    result = store.compact(1380.0, raw_retention_s=60.0, bucket_s=60.0, rollup_retention_s=3600.0,
                           event_retention_s=600.0)  # fmt: skip
    assert result.downsampled_reports == 12 and result.deleted_raw == 12 and result.deleted_events == 1
    assert store.telemetry_count("d1") == 6
    after = store.series("d1", 1200.0, 1380.0, 60.0)
    assert [(p.ts, p.reports, p.p95_ms) for p in after] == [(p.ts, p.reports, p.p95_ms) for p in before]
    assert [p.golden_agreement for p in after] == pytest.approx([p.golden_agreement for p in before])
    again = store.compact(1380.0, raw_retention_s=60.0, bucket_s=60.0, rollup_retention_s=3600.0,
                          event_retention_s=600.0)  # fmt: skip
    assert again.downsampled_reports == 0
    gone = store.compact(9000.0, raw_retention_s=60.0, bucket_s=60.0, rollup_retention_s=3600.0,
                         event_retention_s=600.0)  # fmt: skip
    assert gone.deleted_rollups == 3 and store.series("d1", 0.0, 9000.0, 60.0) == []


def test_compaction_works_in_short_transactions_of_whole_buckets(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefleet.control.store.sql import database

    monkeypatch.setattr(database, "BATCH_ROWS", 8)  # so 200 reports take many transactions
    reports = [telemetry(f"d{i % 2}", i + 1, 1000.0 + 3 * i, p95=float(i % 7)) for i in range(200)]
    store.add_telemetry(reports, 1.0)
    before = {d: store.series(d, 0.0, 2000.0, 60.0) for d in ("d0", "d1")}
    result = store.compact(1600.0, raw_retention_s=0.0, bucket_s=10.0, rollup_retention_s=1e9, event_retention_s=1e9)
    assert result.downsampled_reports == result.deleted_raw == 200 and store.telemetry_count() == 0
    for device, series in before.items():
        after = store.series(device, 0.0, 2000.0, 60.0)
        assert [(p.ts, p.reports, p.requests) for p in after] == [(p.ts, p.reports, p.requests) for p in series]
        assert [p.p95_ms for p in after] == pytest.approx([p.p95_ms for p in series])
    gone = store.compact(1e9, raw_retention_s=0.0, bucket_s=10.0, rollup_retention_s=1.0, event_retention_s=1e9)
    assert gone.deleted_rollups == 120, "2 devices x 60 buckets of 10 s, deleted 8 at a time"


def test_groups_deployments_published_and_bundles_round_trip(store: Store) -> None:
    group = GroupDef("berlin", ("d1",), "site=berlin", 5)
    store.put_group(group)
    assert store.groups() == {"berlin": group}
    assert store.delete_group("berlin") and not store.delete_group("berlin")
    base = Deployment("fleet", "*", "p", "b1", "m", "1", updated_at=1.0)
    pin = Deployment("device", "d1", "p", "b2", "m", "2", rollback=True, source="rollback:r1", updated_at=2.0)
    store.put_deployment(base)
    store.put_deployment(pin)
    assert store.deployments() == [pin, base]
    assert store.delete_deployment("device", "d1") == 1 and store.deployments() == [base]
    store.set_published(("d1", "default"), PublishedDesired("d1", "b1", False, 3.0))
    assert store.published()[("d1", "default")].bundle_id == "b1"
    store.set_published(("d1", "default"), None)
    assert store.published() == {}
    store.set_published_many([((f"d{i}", "default"), PublishedDesired(f"d{i}", "b2", False, 5.0)) for i in range(100)])
    store.set_published_many([(("d0", "default"), None), (("d1", "default"), PublishedDesired("d1", "b3", True, 6.0))])
    published = store.published()
    assert len(published) == 99 and published[("d1", "default")] == PublishedDesired("d1", "b3", True, 6.0)
    store.put_bundle(BundleRecord("b1", "m", "1", "p", 10, 0.01, 4.0))
    assert store.bundle("b1") == BundleRecord("b1", "m", "1", "p", 10, 0.01, 4.0) and store.bundle("x") is None


def test_rollout_rows_and_commands(store: Store) -> None:
    store.save_rollout(RolloutRow("r1", "running", '{"a": 1}', 1.0, 1.0))
    store.set_command("r1", "pause")
    store.save_rollout(RolloutRow("r1", "running", '{"a": 2}', 1.0, 2.0))  # the engine saves: command survives
    assert store.take_command("r1") == "pause" and store.take_command("r1") is None
    assert [r.doc for r in store.rollouts(["running"])] == ['{"a": 2}'] and store.rollouts(["succeeded"]) == []
    with pytest.raises(UnknownNameError, match="unknown rollout 'r9'; valid: r1"):
        store.set_command("r9", "abort")


def test_one_lease_holder_at_a_time(store: Store) -> None:
    assert store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert not store.acquire_lease("engine", "b", 10.0, now=105.0)
    assert store.acquire_lease("engine", "a", 10.0, now=105.0), "renewal"
    assert store.acquire_lease("engine", "b", 10.0, now=116.0), "expired: taken over"
    store.release_lease("engine", "b")
    assert store.lease("engine") is None


def test_a_lease_term_fences_rollout_writes_of_a_holder_that_lost_it(store: Store) -> None:
    first = store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert first is not None and store.acquire_lease("engine", "a", 10.0, now=105.0) == first, "renewal: same term"
    stale = store.with_fence(Fence("engine", "a", first))
    stale.save_rollout(RolloutRow("r1", "running", '{"wave": 0}', 1.0, 1.0))
    stale.put_deployment(Deployment("device", "d1", "p", "b1", "m", "1", updated_at=1.0))
    # "a" stalls past its lease; "b" takes over with a higher token.
    second = store.acquire_lease("engine", "b", 10.0, now=120.0)
    assert second is not None and second > first
    with pytest.raises(FencedOut, match="term 1 of a is over"):
        stale.save_rollout(RolloutRow("r1", "running", '{"wave": 1}', 1.0, 2.0))
    with pytest.raises(FencedOut):
        stale.put_deployment(Deployment("device", "d1", "p", "b2", "m", "2", updated_at=2.0))
    with pytest.raises(FencedOut):
        stale.set_published(("d1", "default"), PublishedDesired("d1", "b2", False, 2.0))
    with pytest.raises(FencedOut):
        stale.delete_deployment("device", "d1")
    row = store.rollout("r1")
    assert row is not None and row.doc == '{"wave": 0}' and store.deployments()[0].bundle_id == "b1", "nothing written"
    current = store.with_fence(Fence("engine", "b", second))
    current.save_rollout(RolloutRow("r1", "running", '{"wave": 1}', 1.0, 2.0))
    stale.close()  # a fenced view shares the connections and closes nothing
    assert store.rollout("r1") is not None
    # A release ends the term too, and the next holder never gets a token handed out before.
    store.release_lease("engine", "b")
    with pytest.raises(FencedOut, match="now held by nobody"):
        current.save_rollout(RolloutRow("r1", "running", '{"wave": 2}', 1.0, 3.0))
    third = store.acquire_lease("engine", "a", 10.0, now=130.0)
    assert third is not None and third > second


def test_counters_add_up(store: Store) -> None:
    store.add_counters({"ingest.telemetry": 3, "ingest.duplicates": 0})
    store.add_counters({"ingest.telemetry": 2})
    assert store.counters() == {"ingest.telemetry": 5}


def test_telemetry_write_times_are_saved_with_the_counters(store: Store) -> None:
    for batch in range(4):
        store.add_telemetry([telemetry("d1", batch * 10 + i + 1, 1000.0 + batch * 10 + i) for i in range(10)], 1.0)
    assert not any(k.startswith(WRITE_MS_COUNTER) for k in store.counters()), "nothing is written on its own"
    store.add_counters({"ingest.telemetry": 40})
    counters = store.counters()
    assert sum(v for k, v in counters.items() if k.startswith(WRITE_MS_COUNTER)) == 4
    p95 = write_ms_quantile(counters, 0.95)
    assert p95 is not None and 0 < p95 <= 10000


def test_write_time_quantiles_read_the_histogram() -> None:
    histogram = {f"{WRITE_MS_COUNTER}00002": 90, f"{WRITE_MS_COUNTER}00050": 9, f"{WRITE_MS_COUNTER}inf": 1, "x": 5}
    assert write_ms_quantile(histogram, 0.5) == 2.0 and write_ms_quantile(histogram, 0.95) == 50.0
    assert write_ms_quantile(histogram, 1.0) == float("inf") and write_ms_quantile({}, 0.95) is None


def _writer(url: str, worker: int) -> None:
    s = open_store(url)
    for batch in range(20):
        # Both workers write the same 10 reports per batch (re-deliveries) plus 10 of their own.
        shared = [telemetry("d1", batch * 10 + i + 1, 1000.0 + batch * 10 + i) for i in range(10)]
        own = [telemetry(f"w{worker}", batch * 10 + i + 1, 1000.0 + batch * 10 + i) for i in range(10)]
        s.add_telemetry(shared + own, 1.0)
        s.add_counters({"writes": 1})
    s.close()


def test_processes_sharing_one_store_each_report_once(store_url: str) -> None:
    url = store_url
    open_store(url).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w)) for w in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    store = open_store(url)
    assert store.telemetry_count("d1") == 200 and store.telemetry_count("w0") == 200
    assert store.counters()["writes"] == 40
    store.close()
