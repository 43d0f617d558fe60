"""Telemetry and events in SQL: exactly-once inserts, the latest report per device, history in time buckets, and
compaction (downsampling and retention) in short transactions.

Raw reports live in `telemetry` for `raw_retention_s`; compaction then moves them into `telemetry_rollup`,
one row per (device, `bucket_s` bucket, bundle), and drops rollups and events past their retention. It never
holds a lock for long: raw reports move a few whole buckets per transaction (each bucket is summed and
deleted in the same transaction, so it is counted once), and retention deletes at most `batch_rows` rows per
transaction, so ingestion keeps writing in between.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from edgefleet.control.store import Compaction, EventRecord, SeriesPoint, TelemetryPoint
from edgefleet.control.store_quality import QualitySql, add_quality
from edgefleet.control.store_sql_base import Db, device_window
from edgefleet.core.messages import Event, Telemetry

TELEMETRY_COLUMNS = (
    "device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms, p99_ms, latency_count, "
    "golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c"
)
_N_TELEMETRY = len(TELEMETRY_COLUMNS.split(", "))
_MARKS = ", ".join("?" for _ in range(_N_TELEMETRY + 1))
BATCH_ROWS = 5000


def telemetry_row(t: Telemetry, received_at: float) -> tuple[Any, ...]:
    lat = t.latency
    return (
        t.device_id, t.seq or None, t.ts, t.bundle_id, t.provider, t.window_s, t.requests, t.errors,
        lat.p50_ms, lat.p95_ms, lat.p99_ms, lat.count, t.golden_agreement, t.golden_max_abs_error,
        t.cpu_percent, t.rss_mb, t.temperature_c, received_at,
    )  # fmt: skip


def _point(row: Sequence[Any]) -> TelemetryPoint:
    return TelemetryPoint(*row[:_N_TELEMETRY])


class TelemetrySql(QualitySql):
    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        if not reports:
            return 0
        rows = [telemetry_row(t, received_at) for t in reports]
        latest: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            if row[0] not in latest or row[2] >= latest[row[0]][2]:
                latest[row[0]] = row
        updates = ", ".join(f"{c} = excluded.{c}" for c in TELEMETRY_COLUMNS.split(", ")[1:])
        started = time.perf_counter()
        with self._tx() as db:
            inserted = db.executemany(
                f"INSERT INTO telemetry ({TELEMETRY_COLUMNS}, received_at) VALUES ({_MARKS}) ON CONFLICT DO NOTHING",
                rows,
            )
            # In device order: concurrent writers lock the rows in the same order and never deadlock.
            db.executemany(
                f"INSERT INTO latest_telemetry ({TELEMETRY_COLUMNS}, received_at) VALUES ({_MARKS})"
                f" ON CONFLICT (device_id) DO UPDATE SET {updates}, received_at = excluded.received_at"
                " WHERE excluded.ts >= latest_telemetry.ts",
                [latest[d] for d in sorted(latest)],
            )
            add_quality(db, reports, received_at)  # stored (and acknowledged) with its report, or not at all
        self.write_timings.record(1000 * (time.perf_counter() - started))
        return inserted

    def add_events(self, events: Sequence[Event], received_at: float) -> int:
        if not events:
            return 0
        rows = [
            (e.device_id, e.seq or None, e.ts, e.kind, e.bundle_id, e.detail, e.progress, received_at) for e in events
        ]
        with self._tx() as db:
            return db.executemany(
                "INSERT INTO events (device_id, seq, ts, kind, bundle_id, detail, progress, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                rows,
            )

    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None
    ) -> list[TelemetryPoint]:
        sql, params = device_window("telemetry", TELEMETRY_COLUMNS, device_id, since, until, bundle_id)
        with self._read() as db:
            rows = db.execute(sql, params).fetchall()
        return [_point(r) for r in rows]

    def latest_telemetry(self) -> dict[str, TelemetryPoint]:
        with self._read() as db:
            rows = db.execute(f"SELECT {TELEMETRY_COLUMNS} FROM latest_telemetry").fetchall()
        return {r[0]: _point(r) for r in rows}

    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        step = max(step, 1e-3)
        raw_b, rolled_b = self.dialect.bucket.format(x="ts"), self.dialect.bucket.format(x="bucket")
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
        with self._read() as db:
            for sql in (rolled, raw):
                for row in db.execute(sql, params).fetchall():
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

    def events(
        self, device_id: str | None = None, since: float = 0.0, bundle_id: str | None = None, limit: int = 1000,
        received_since: float | None = None,
    ) -> list[EventRecord]:  # fmt: skip
        sql = "SELECT device_id, seq, ts, kind, bundle_id, detail, progress FROM events WHERE ts >= ?"
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
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY ts DESC LIMIT ?", [*params, limit]).fetchall()
        return [EventRecord(*r) for r in reversed(rows)]

    def telemetry_count(self, device_id: str | None = None) -> int:
        with self._read() as db:
            if device_id is None:
                row = db.execute("SELECT COUNT(*) FROM telemetry").fetchone()
            else:
                row = db.execute("SELECT COUNT(*) FROM telemetry WHERE device_id = ?", (device_id,)).fetchone()
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
        # Cut at a bucket boundary so that every bucket is downsampled once, whole.
        cutoff = (now - raw_retention_s) // bucket_s * bucket_s
        moved = deleted_raw = 0
        span = 1  # buckets per transaction, adapted to keep each near BATCH_ROWS reports
        while True:
            with self._read() as db:
                (oldest,) = db.execute("SELECT MIN(ts) FROM telemetry WHERE ts < ?", (cutoff,)).fetchone()
            if oldest is None:
                break
            start = float(oldest) // bucket_s * bucket_s
            end = min(cutoff, start + span * bucket_s)
            with self._tx(snapshot=True) as db:
                reports, deleted = self._downsample(db, start, end, bucket_s)
            moved, deleted_raw = moved + reports, deleted_raw + deleted
            span = span * 2 if reports < BATCH_ROWS // 2 else max(1, span // 2) if reports > BATCH_ROWS else span
        self._delete_batched("telemetry_quality", "ts < ?", cutoff)  # quality rows live as long as raw reports
        self._delete_batched("alerts", "ts < ?", now - event_retention_s)  # alerts as long as events
        return Compaction(
            moved,
            deleted_raw,
            self._delete_batched("telemetry_rollup", "bucket < ?", now - rollup_retention_s),
            self._delete_batched("events", "ts < ?", now - event_retention_s),
        )

    def _downsample(self, db: Db, start: float, end: float, bucket_s: float) -> tuple[int, int]:
        """Sum the raw reports in [start, end) into their buckets and delete them, in the caller's transaction."""
        d = self.dialect
        (reports,) = db.execute("SELECT COUNT(*) FROM telemetry WHERE ts >= ? AND ts < ?", (start, end)).fetchone()
        db.execute(
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
        deleted = db.execute("DELETE FROM telemetry WHERE ts >= ? AND ts < ?", (start, end)).rowcount
        return int(reports), int(deleted)

    def _delete_batched(self, table: str, cond: str, bound: float) -> int:
        sql = self.dialect.batch_delete.format(table=table, cond=cond)
        total = 0
        while True:
            with self._tx() as db:
                deleted = db.execute(sql, (bound, BATCH_ROWS)).rowcount
            total += deleted
            if deleted < BATCH_ROWS:
                return total
