"""The reports repository: telemetry and events (exactly-once inserts, the latest report per device, history in
time buckets), compaction (downsampling and retention) in short transactions, and the ingestion counters.

Raw reports live in `telemetry` for `raw_retention_s`; compaction then moves them into `telemetry_rollup`,
one row per (device, `bucket_s` bucket, bundle), and drops rollups and events past their retention. It never
holds a lock for long: raw reports move a few whole buckets per transaction (each bucket is summed and
deleted in the same transaction, so it is counted once), and retention deletes at most `BATCH_ROWS` rows per
transaction, so ingestion keeps writing in between. A report's quality figures are stored by the quality
repository in the same transaction as the report.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

from edgefleet.control.store.evidence import SqlEvidence
from edgefleet.control.store.quality import SqlQuality
from edgefleet.control.store.records import Compaction, EventRecord, SeriesPoint, SlotKey, TelemetryPoint
from edgefleet.control.store.sql import database
from edgefleet.control.store.sql.database import Database, Db, delete_batched, device_window, unit_of_work
from edgefleet.core.messages import Event, Telemetry

TELEMETRY_COLUMNS = (
    "device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms, p99_ms, latency_count, "
    "golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c, slot"
)
_TELEMETRY = TELEMETRY_COLUMNS.split(", ")
_N_TELEMETRY = len(_TELEMETRY)
_MARKS = ", ".join("?" for _ in range(_N_TELEMETRY + 1))
_EVENT = ("device_id", "seq", "ts", "kind", "bundle_id", "detail", "progress", "slot", "received_at")

WRITE_MS_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
WRITE_MS_COUNTER = "store.write_ms.le_"  # + a bound (zero-padded) or "inf": a cumulative-free histogram


class Reports(Protocol):
    """Telemetry and events (at-least-once in, exactly once stored), their history, and the counters."""

    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        """Store reports, skipping ones already stored (same device, seq and ts); returns how many were new."""
        ...

    def add_events(self, events: Sequence[Event], received_at: float) -> int: ...

    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[TelemetryPoint]:  # fmt: skip
        """Raw reports of one device in [since, until), oldest first (of one bundle, of one slot)."""
        ...

    def latest_telemetry(self) -> dict[SlotKey, TelemetryPoint]:
        """Each (device, slot)'s latest report."""
        ...

    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        """The device's history averaged per `step` seconds, from raw reports and downsampled buckets."""
        ...

    def events(
        self, device_id: str | None = None, since: float = 0.0, bundle_id: str | None = None, limit: int = 1000,
        received_since: float | None = None,
    ) -> list[EventRecord]:  # fmt: skip
        """Events oldest first (the newest `limit` of them). `since` is on the devices' clocks,
        `received_since` on the control plane's (immune to a device whose clock is off)."""
        ...

    def telemetry_count(self, device_id: str | None = None) -> int: ...

    def compact(
        self, now: float, *, raw_retention_s: float, bucket_s: float, rollup_retention_s: float,
        event_retention_s: float,
    ) -> Compaction:  # fmt: skip
        """Downsample raw reports older than `raw_retention_s` into `bucket_s` buckets, drop what is too old
        (`downsample` then `expire`; the control plane runs them as separate loops)."""
        ...

    def downsample(self, now: float, *, raw_retention_s: float, bucket_s: float) -> tuple[int, int]:
        """Sum raw reports older than `raw_retention_s` into `bucket_s` buckets and delete them: (reports moved,
        raw rows deleted)."""
        ...

    def expire(
        self, now: float, *, raw_retention_s: float, bucket_s: float, rollup_retention_s: float,
        event_retention_s: float,
    ) -> tuple[int, int]:  # fmt: skip
        """Retention by age: drop buckets, events, quality rows and evidence past their windows (rollups deleted,
        events deleted). Independent of `downsample`, so one failing never stops the other."""
        ...

    def stored_through(self, seen: Mapping[str, Sequence[int]], lost: Mapping[str, int], now: float) -> dict[str, int]:
        """Advance each device's highest contiguous stored sequence number, given the numbers of its reports
        just stored (`seen`) and what its `reports-dropped` events said will never come (`lost`); the devices
        whose number moved, with the new number (what the control plane acknowledges: `StoredUpTo`)."""
        ...

    def add_counters(self, deltas: Mapping[str, int]) -> None: ...

    def counters(self) -> dict[str, int]: ...


class WriteTimings:
    """How long telemetry writes took, as histogram buckets; saved with the next `add_counters` (no extra
    transaction), so `counters()` shows every process's store write latency (the fleet bench reads its p95)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}

    def record(self, ms: float) -> None:
        i = bisect.bisect_left(WRITE_MS_BOUNDS, ms)
        name = WRITE_MS_COUNTER + (f"{WRITE_MS_BOUNDS[i]:05d}" if i < len(WRITE_MS_BOUNDS) else "inf")
        with self._lock:
            self._pending[name] = self._pending.get(name, 0) + 1

    def take(self) -> dict[str, int]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending


def write_ms_quantile(counters: dict[str, int], q: float) -> float | None:
    """The q-quantile (upper bucket bound, ms) of the write histogram in `counters` (or a difference of two)."""
    buckets = sorted(
        (k.removeprefix(WRITE_MS_COUNTER), v) for k, v in counters.items() if k.startswith(WRITE_MS_COUNTER)
    )
    total = sum(v for _, v in buckets)
    if total <= 0:
        return None
    seen = 0
    for bound, count in buckets:  # "00001" < ... < "10000" < "inf"
        seen += count
        if seen >= q * total:
            return float(bound) if bound != "inf" else float("inf")
    return float("inf")


def telemetry_row(t: Telemetry, received_at: float) -> tuple[Any, ...]:
    lat = t.latency
    return (
        t.device_id, t.seq or None, t.ts, t.bundle_id, t.provider, t.window_s, t.requests, t.errors,
        lat.p50_ms, lat.p95_ms, lat.p99_ms, lat.count, t.golden_agreement, t.golden_max_abs_error,
        t.cpu_percent, t.rss_mb, t.temperature_c, t.slot, received_at,
    )  # fmt: skip


def _point(row: Sequence[Any]) -> TelemetryPoint:
    return TelemetryPoint(*row[:_N_TELEMETRY])


class SqlReports:
    def __init__(self, db: Database, quality: SqlQuality, evidence: SqlEvidence) -> None:
        self.db, self.quality, self.evidence = db, quality, evidence
        self.write_timings = WriteTimings()

    @unit_of_work()
    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        if not reports:
            return 0
        rows = [telemetry_row(t, received_at) for t in reports]
        latest: dict[tuple[str, str], tuple[Any, ...]] = {}
        for row in rows:
            key = (row[0], row[_N_TELEMETRY - 1])
            if key not in latest or row[2] >= latest[key][2]:
                latest[key] = row
        updates = ", ".join(f"{c} = excluded.{c}" for c in _TELEMETRY[1:])
        started = time.perf_counter()
        with self.db.tx() as conn:
            inserted = conn.insert_rows("telemetry", [*_TELEMETRY, "received_at"], rows, "ON CONFLICT DO NOTHING")
            # In (device, slot) order: concurrent writers lock the rows in the same order and never deadlock.
            conn.executemany(
                f"INSERT INTO latest_telemetry ({TELEMETRY_COLUMNS}, received_at) VALUES ({_MARKS})"
                f" ON CONFLICT (device_id, slot) DO UPDATE SET {updates}, received_at = excluded.received_at"
                " WHERE excluded.ts >= latest_telemetry.ts",
                [latest[d] for d in sorted(latest)],
            )
            self.quality.add_in(conn, reports, received_at)  # stored (and acknowledged) with its report, or not at all
            self.evidence.add_in(conn, reports, received_at)  # and so are its link counters
        self.write_timings.record(1000 * (time.perf_counter() - started))
        return inserted

    @unit_of_work()
    def add_events(self, events: Sequence[Event], received_at: float) -> int:
        if not events:
            return 0
        rows = [
            (e.device_id, e.seq or None, e.ts, e.kind, e.bundle_id, e.detail, e.progress, e.slot, received_at)
            for e in events
        ]
        with self.db.tx() as conn:
            return conn.insert_rows("events", _EVENT, rows, "ON CONFLICT DO NOTHING")

    @unit_of_work()
    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[TelemetryPoint]:  # fmt: skip
        sql, params = device_window("telemetry", TELEMETRY_COLUMNS, device_id, since, until, bundle_id, slot)
        with self.db.read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_point(r) for r in rows]

    @unit_of_work()
    def latest_telemetry(self) -> dict[SlotKey, TelemetryPoint]:
        with self.db.read() as conn:
            rows = conn.execute(f"SELECT {TELEMETRY_COLUMNS} FROM latest_telemetry").fetchall()
        return {(r[0], r[_N_TELEMETRY - 1]): _point(r) for r in rows}

    @unit_of_work()
    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        step = max(step, 1e-3)
        dialect = self.db.dialect
        raw_b, rolled_b = dialect.bucket.format(x="ts"), dialect.bucket.format(x="bucket")
        raw = (
            f"SELECT {raw_b} AS b, COUNT(*), SUM(requests), SUM(errors), SUM(p50_ms),"
            " COUNT(p50_ms), SUM(p95_ms), COUNT(p95_ms), SUM(golden_agreement), COUNT(golden_agreement),"
            " MAX(bundle_id) FROM telemetry WHERE device_id = ? AND ts >= ? AND ts < ? GROUP BY 1"
        )
        rolled = (
            f"SELECT {rolled_b} AS b, SUM(reports), SUM(requests), SUM(errors), SUM(p50_sum),"
            " SUM(p50_n), SUM(p95_sum), SUM(p95_n), SUM(golden_sum), SUM(golden_n), MAX(bundle_id)"
            " FROM telemetry_rollup WHERE device_id = ? AND bucket >= ? AND bucket < ? GROUP BY 1"
        )
        params = (step, device_id, since, until)
        merged: dict[int, list[Any]] = {}
        with self.db.read() as conn:
            for sql in (rolled, raw):
                for fetched in conn.execute(sql, params).fetchall():
                    # PostgreSQL sums BIGINT columns into NUMERIC (a Decimal here): counts are ints again
                    row = [int(v) if isinstance(v, Decimal) else v for v in fetched]
                    slot = merged.get(int(row[0]))
                    if slot is None:
                        merged[int(row[0])] = list(row)
                        continue
                    for i in range(1, 10):
                        slot[i] = (slot[i] or 0) + (row[i] or 0)
                    slot[10] = row[10] or slot[10]

        def avg(total: float | None, count: int | None) -> float | None:
            return round(float(total) / count, 6) if count and total is not None else None

        return [
            SeriesPoint(
                ts=b * step,
                reports=int(r[1] or 0),
                requests=int(r[2] or 0),
                errors=int(r[3] or 0),
                p50_ms=avg(r[4], r[5]),
                p95_ms=avg(r[6], r[7]),
                golden_agreement=avg(r[8], r[9]),
                bundle_id=r[10],
            )
            for b, r in sorted(merged.items())
        ]

    @unit_of_work()
    def events(
        self, device_id: str | None = None, since: float = 0.0, bundle_id: str | None = None, limit: int = 1000,
        received_since: float | None = None,
    ) -> list[EventRecord]:  # fmt: skip
        sql = "SELECT device_id, seq, ts, kind, bundle_id, detail, progress, slot FROM events WHERE ts >= ?"
        params: list[Any] = [since]
        if received_since is not None:
            sql += " AND received_at >= ?"
            params.append(received_since)
        if device_id is not None:
            sql += " AND device_id = ?"
            params.append(device_id)
        if bundle_id is not None:
            sql += " AND bundle_id = ?"
            params.append(bundle_id)
        with self.db.read() as conn:
            rows = conn.execute(sql + " ORDER BY ts DESC LIMIT ?", [*params, limit]).fetchall()
        return [EventRecord(*r) for r in reversed(rows)]

    @unit_of_work()
    def telemetry_count(self, device_id: str | None = None) -> int:
        with self.db.read() as conn:
            if device_id is None:
                row = conn.execute("SELECT COUNT(*) FROM telemetry").fetchone()
            else:
                row = conn.execute("SELECT COUNT(*) FROM telemetry WHERE device_id = ?", (device_id,)).fetchone()
        return int(row[0])

    def compact(
        self,
        now: float,
        *,
        raw_retention_s: float,
        bucket_s: float,
        rollup_retention_s: float,
        event_retention_s: float,
    ) -> Compaction:
        moved, deleted_raw = self.downsample(now, raw_retention_s=raw_retention_s, bucket_s=bucket_s)
        rollups, events = self.expire(
            now, raw_retention_s=raw_retention_s, bucket_s=bucket_s, rollup_retention_s=rollup_retention_s,
            event_retention_s=event_retention_s,
        )  # fmt: skip
        return Compaction(moved, deleted_raw, rollups, events)

    @unit_of_work()
    def downsample(self, now: float, *, raw_retention_s: float, bucket_s: float) -> tuple[int, int]:
        # Cut at a bucket boundary so that every bucket is downsampled once, whole.
        cutoff = (now - raw_retention_s) // bucket_s * bucket_s
        moved = deleted_raw = 0
        span = 1  # buckets per transaction, adapted to keep each near BATCH_ROWS reports
        while True:
            batch_rows = database.BATCH_ROWS
            with self.db.read() as conn:
                (oldest,) = conn.execute("SELECT MIN(ts) FROM telemetry WHERE ts < ?", (cutoff,)).fetchone()
            if oldest is None:
                break
            start = float(oldest) // bucket_s * bucket_s
            end = min(cutoff, start + span * bucket_s)
            with self.db.tx(snapshot=True) as conn:
                reports, deleted = self._downsample(conn, start, end, bucket_s)
            moved, deleted_raw = moved + reports, deleted_raw + deleted
            span = span * 2 if reports < batch_rows // 2 else max(1, span // 2) if reports > batch_rows else span
        return moved, deleted_raw

    @unit_of_work()
    def expire(
        self, now: float, *, raw_retention_s: float, bucket_s: float, rollup_retention_s: float,
        event_retention_s: float,
    ) -> tuple[int, int]:  # fmt: skip
        cutoff = (now - raw_retention_s) // bucket_s * bucket_s
        self.quality.expire(cutoff, now - event_retention_s)
        self.evidence.expire(cutoff)
        return (
            delete_batched(self.db, "telemetry_rollup", "bucket < ?", now - rollup_retention_s),
            delete_batched(self.db, "events", "ts < ?", now - event_retention_s),
        )

    def _downsample(self, conn: Db, start: float, end: float, bucket_s: float) -> tuple[int, int]:
        """Sum the raw reports in [start, end) into their buckets and delete them, in the caller's transaction."""
        d = self.db.dialect
        (reports,) = conn.execute("SELECT COUNT(*) FROM telemetry WHERE ts >= ? AND ts < ?", (start, end)).fetchone()
        conn.execute(
            "INSERT INTO telemetry_rollup (device_id, bucket, bundle_id, reports, requests, errors, p50_sum, p50_n,"
            " p95_sum, p95_n, p95_max, golden_sum, golden_n, golden_min)"
            f" SELECT device_id, {d.bucket.format(x='ts')} * ?, COALESCE(bundle_id, ''), COUNT(*),"
            " COALESCE(SUM(requests), 0), COALESCE(SUM(errors), 0), SUM(p50_ms), COUNT(p50_ms), SUM(p95_ms),"
            " COUNT(p95_ms), MAX(p95_ms), SUM(golden_agreement), COUNT(golden_agreement), MIN(golden_agreement)"
            " FROM telemetry WHERE ts >= ? AND ts < ? GROUP BY 1, 2, 3"
            " ON CONFLICT (device_id, bucket, bundle_id) DO UPDATE SET"
            " reports = telemetry_rollup.reports + excluded.reports,"
            " requests = telemetry_rollup.requests + excluded.requests,"
            " errors = telemetry_rollup.errors + excluded.errors,"
            " p50_sum = COALESCE(telemetry_rollup.p50_sum, 0) + COALESCE(excluded.p50_sum, 0),"
            " p50_n = telemetry_rollup.p50_n + excluded.p50_n,"
            " p95_sum = COALESCE(telemetry_rollup.p95_sum, 0) + COALESCE(excluded.p95_sum, 0),"
            " p95_n = telemetry_rollup.p95_n + excluded.p95_n,"
            f" p95_max = {d.greatest}(COALESCE(telemetry_rollup.p95_max, 0), COALESCE(excluded.p95_max, 0)),"
            " golden_sum = COALESCE(telemetry_rollup.golden_sum, 0) + COALESCE(excluded.golden_sum, 0),"
            " golden_n = telemetry_rollup.golden_n + excluded.golden_n,"
            f" golden_min = {d.least}(COALESCE(telemetry_rollup.golden_min, 1), COALESCE(excluded.golden_min, 1))",
            (bucket_s, bucket_s, start, end),
        )
        deleted = conn.execute("DELETE FROM telemetry WHERE ts >= ? AND ts < ?", (start, end)).rowcount
        return int(reports), int(deleted)

    @unit_of_work()
    def stored_through(self, seen: Mapping[str, Sequence[int]], lost: Mapping[str, int], now: float) -> dict[str, int]:
        devices = sorted(set(seen) | set(lost))
        if not devices:
            return {}
        advanced: dict[str, int] = {}
        with self.db.tx() as conn:
            known: dict[str, tuple[int, int]] = {}
            for start in range(0, len(devices), 500):
                part = devices[start : start + 500]
                marks = ", ".join("?" for _ in part)
                for device_id, up_to, lost_through in conn.execute(
                    f"SELECT device_id, up_to, lost_through FROM report_acks WHERE device_id IN ({marks})", part
                ).fetchall():
                    known[str(device_id)] = (int(up_to), int(lost_through))
            rows = []
            for device_id in devices:
                was, was_lost = known.get(device_id, (0, 0))
                lost_through = max(was_lost, lost.get(device_id, 0))
                up_to = max(was, lost_through)
                fresh = sorted({n for n in seen.get(device_id, ()) if n > up_to})
                up_to = _contiguous(up_to, fresh)
                if fresh and fresh[-1] > up_to:  # a gap: another instance may have stored what fills it
                    up_to = _contiguous(up_to, self._numbers_above(conn, device_id, up_to))
                if device_id not in known or (up_to, lost_through) != (was, was_lost):
                    rows.append((device_id, up_to, lost_through, now))
                if up_to > was:
                    advanced[device_id] = up_to
            # Only ever forward: two instances may advance one device at once.
            conn.executemany(
                "INSERT INTO report_acks (device_id, up_to, lost_through, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (device_id) DO UPDATE SET"
                " up_to = CASE WHEN excluded.up_to > report_acks.up_to THEN excluded.up_to ELSE report_acks.up_to END,"
                " lost_through = CASE WHEN excluded.lost_through > report_acks.lost_through"
                " THEN excluded.lost_through ELSE report_acks.lost_through END, updated_at = excluded.updated_at",
                rows,
            )
        return advanced

    @staticmethod
    def _numbers_above(conn: Db, device_id: str, up_to: int) -> list[int]:
        """The sequence numbers of the device's stored reports above `up_to`, in order (at most 20,000)."""
        rows = conn.execute(
            "SELECT seq FROM telemetry WHERE device_id = ? AND seq > ?"
            " UNION SELECT seq FROM events WHERE device_id = ? AND seq > ? ORDER BY 1 LIMIT 20000",
            (device_id, up_to, device_id, up_to),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def add_counters(self, deltas: Mapping[str, int]) -> None:
        merged = dict(deltas)
        for name, count in self.write_timings.take().items():
            merged[name] = merged.get(name, 0) + count
        items = sorted((k, v) for k, v in merged.items() if v)
        if items:
            self._add_counters(items)

    @unit_of_work()
    def _add_counters(self, items: list[tuple[str, int]]) -> None:
        with self.db.tx() as conn:
            conn.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                items,
            )

    @unit_of_work()
    def counters(self) -> dict[str, int]:
        with self.db.read() as conn:
            return {r[0]: int(r[1]) for r in conn.execute("SELECT name, value FROM counters ORDER BY name").fetchall()}


def _contiguous(up_to: int, numbers: Sequence[int]) -> int:
    """How far `up_to` moves along the sorted `numbers` without a gap."""
    for n in numbers:
        if n == up_to + 1:
            up_to = n
        elif n > up_to + 1:
            break
    return up_to
