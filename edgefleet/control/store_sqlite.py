"""The SQLite store: one file, WAL journal, a small pool of connections (readers never block the writer).

Several control-plane processes on one machine may share the file: writes are short transactions,
`busy_timeout` waits out the other writer, and deduplication lives in UNIQUE constraints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgefleet.control.store import (
    BundleRecord,
    Compaction,
    Deployment,
    DeviceRecord,
    EventRecord,
    GroupDef,
    PublishedDesired,
    RolloutRow,
    Scope,
    SeriesPoint,
    Store,
    StoreError,
    TelemetryPoint,
)
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.messages import DeviceStatus, Event, Telemetry

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, online INTEGER NOT NULL, state TEXT NOT NULL, profile TEXT,
    groups_json TEXT NOT NULL DEFAULT '[]', labels_json TEXT NOT NULL DEFAULT '{}', agent_version TEXT,
    arch TEXT, os TEXT, hostname TEXT, active_bundle TEXT, active_model TEXT, provider TEXT,
    verified INTEGER NOT NULL DEFAULT 0, last_error TEXT, status_ts REAL NOT NULL, first_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS telemetry (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, provider TEXT, window_s REAL,
    requests INTEGER, errors INTEGER, p50_ms REAL, p95_ms REAL, p99_ms REAL, latency_count INTEGER,
    golden_agreement REAL, golden_max_abs_error REAL, cpu_percent REAL, rss_mb REAL, temperature_c REAL,
    received_at REAL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS telemetry_device_ts ON telemetry (device_id, ts);
CREATE INDEX IF NOT EXISTS telemetry_ts ON telemetry (ts);
CREATE TABLE IF NOT EXISTS latest_telemetry (
    device_id TEXT PRIMARY KEY, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, provider TEXT, window_s REAL,
    requests INTEGER, errors INTEGER, p50_ms REAL, p95_ms REAL, p99_ms REAL, latency_count INTEGER,
    golden_agreement REAL, golden_max_abs_error REAL, cpu_percent REAL, rss_mb REAL, temperature_c REAL,
    received_at REAL
);
CREATE TABLE IF NOT EXISTS telemetry_rollup (
    device_id TEXT NOT NULL, bucket REAL NOT NULL, bundle_id TEXT NOT NULL, reports INTEGER NOT NULL,
    requests INTEGER NOT NULL, errors INTEGER NOT NULL, p50_sum REAL, p50_n INTEGER, p95_sum REAL, p95_n INTEGER,
    p95_max REAL, golden_sum REAL, golden_n INTEGER, golden_min REAL,
    PRIMARY KEY (device_id, bucket, bundle_id)
);
CREATE TABLE IF NOT EXISTS events (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, kind TEXT NOT NULL, bundle_id TEXT,
    detail TEXT NOT NULL, progress REAL, received_at REAL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS events_device_ts ON events (device_id, ts);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE TABLE IF NOT EXISTS groups (
    name TEXT PRIMARY KEY, devices_json TEXT NOT NULL, selector TEXT, priority INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS deployments (
    scope TEXT NOT NULL, target TEXT NOT NULL, profile TEXT NOT NULL, bundle_id TEXT NOT NULL,
    model_name TEXT NOT NULL, model_version TEXT NOT NULL, rollback INTEGER NOT NULL, source TEXT NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (scope, target, profile)
);
CREATE TABLE IF NOT EXISTS published (
    device_id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, rollback INTEGER NOT NULL, issued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bundles (
    bundle_id TEXT PRIMARY KEY, model_name TEXT NOT NULL, model_version TEXT NOT NULL, profile TEXT NOT NULL,
    size INTEGER NOT NULL, accuracy_budget REAL, published_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, doc TEXT NOT NULL, command TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

_TELEMETRY_COLUMNS = (
    "device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms, p99_ms, latency_count, "
    "golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c"
)
_DEVICE_COLUMNS = (
    "device_id, online, state, profile, groups_json, labels_json, agent_version, arch, os, hostname, active_bundle, "
    "active_model, provider, verified, last_error, status_ts, first_seen"
)
_POOL_SIZE = 8


def _telemetry_row(t: Telemetry, received_at: float) -> tuple[Any, ...]:
    lat = t.latency
    return (
        t.device_id, t.seq or None, t.ts, t.bundle_id, t.provider, t.window_s, t.requests, t.errors,
        lat.p50_ms, lat.p95_ms, lat.p99_ms, lat.count, t.golden_agreement, t.golden_max_abs_error,
        t.cpu_percent, t.rss_mb, t.temperature_c, received_at,
    )  # fmt: skip


def _point(row: Sequence[Any]) -> TelemetryPoint:
    return TelemetryPoint(*row[:17])


def _device(row: Sequence[Any]) -> DeviceRecord:
    return DeviceRecord(
        device_id=row[0], online=bool(row[1]), state=row[2], profile=row[3], groups=tuple(json.loads(row[4])),
        labels=json.loads(row[5]), agent_version=row[6] or "", arch=row[7], os=row[8], hostname=row[9],
        active_bundle=row[10], active_model=row[11], provider=row[12], verified=bool(row[13]), last_error=row[14],
        status_ts=row[15], first_seen=row[16],
    )  # fmt: skip


class SqliteStore(Store):
    def __init__(self, path: Path, url: str) -> None:
        self.url, self.path = url, path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            first = self._connect()
            first.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f"cannot open the store {url}: {err}") from err
        self._pool: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._pool.put(first)
        self._all = [first]
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        try:
            db = self._pool.get_nowait()
        except queue.Empty:
            with self._lock:
                if self._closed:
                    raise StoreError(f"the store {self.url} is closed") from None
                db = self._connect()
                self._all.append(db)
        try:
            yield db
        finally:
            if self._pool.qsize() < _POOL_SIZE:
                self._pool.put(db)
            else:
                with self._lock:
                    self._all.remove(db)
                db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE: take the write lock up front, no upgrade deadlocks)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for db in self._all:
                db.close()
            self._all.clear()

    # --- devices
    def upsert_statuses(self, statuses: Sequence[DeviceStatus], received_at: float) -> None:
        rows = []
        for s in statuses:
            hw = s.hardware
            rows.append((
                s.device_id, int(s.online), s.state, s.profile, json.dumps(s.groups), s.agent_version,
                hw.arch if hw else None, hw.os if hw else None, hw.hostname if hw else None, s.active_bundle,
                s.active_model, s.provider_in_use, int(s.verified), s.last_error,
                s.ts if s.online else received_at, received_at,
            ))  # fmt: skip
        if not rows:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO devices (device_id, online, state, profile, groups_json, agent_version, arch, os,"
                " hostname, active_bundle, active_model, provider, verified, last_error, status_ts, first_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (device_id) DO UPDATE SET online = excluded.online, state = excluded.state,"
                " profile = excluded.profile, groups_json = excluded.groups_json,"
                " agent_version = excluded.agent_version, arch = COALESCE(excluded.arch, devices.arch),"
                " os = COALESCE(excluded.os, devices.os), hostname = COALESCE(excluded.hostname, devices.hostname),"
                " active_bundle = CASE WHEN excluded.online = 1 THEN excluded.active_bundle"
                "   ELSE devices.active_bundle END,"
                " active_model = CASE WHEN excluded.online = 1 THEN excluded.active_model"
                "   ELSE devices.active_model END,"
                " provider = CASE WHEN excluded.online = 1 THEN excluded.provider ELSE devices.provider END,"
                " verified = CASE WHEN excluded.online = 1 THEN excluded.verified ELSE devices.verified END,"
                " last_error = CASE WHEN excluded.online = 1 THEN excluded.last_error ELSE devices.last_error END,"
                " status_ts = excluded.status_ts",
                rows,
            )

    def devices(self) -> list[DeviceRecord]:
        with self._db() as db:
            rows = db.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices ORDER BY device_id").fetchall()
        return [_device(r) for r in rows]

    def device(self, device_id: str) -> DeviceRecord | None:
        with self._db() as db:
            row = db.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)).fetchone()
        return _device(row) if row else None

    def device_ids(self) -> set[str]:
        with self._db() as db:
            return {r[0] for r in db.execute("SELECT device_id FROM devices")}

    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        with self._tx() as db:
            row = db.execute("SELECT labels_json FROM devices WHERE device_id = ?", (device_id,)).fetchone()
            if row is None:
                known = [r[0] for r in db.execute("SELECT device_id FROM devices ORDER BY device_id LIMIT 50")]
                raise UnknownNameError("device", device_id, known)
            labels = {**json.loads(row[0]), **set_}
            for key in remove:
                labels.pop(key, None)
            db.execute(
                "UPDATE devices SET labels_json = ? WHERE device_id = ?",
                (json.dumps(labels, sort_keys=True), device_id),
            )
        record = self.device(device_id)
        assert record is not None
        return record

    # --- telemetry and events
    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        if not reports:
            return 0
        rows = [_telemetry_row(t, received_at) for t in reports]
        latest: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            if row[0] not in latest or row[2] >= latest[row[0]][2]:
                latest[row[0]] = row
        with self._tx() as db:
            before = db.total_changes
            db.executemany(
                f"INSERT OR IGNORE INTO telemetry ({_TELEMETRY_COLUMNS}, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            inserted = db.total_changes - before
            updates = ", ".join(f"{c} = excluded.{c}" for c in _TELEMETRY_COLUMNS.split(", ")[1:])
            db.executemany(
                f"INSERT INTO latest_telemetry ({_TELEMETRY_COLUMNS}, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                f" ON CONFLICT (device_id) DO UPDATE SET {updates}, received_at = excluded.received_at"
                " WHERE excluded.ts >= latest_telemetry.ts",
                list(latest.values()),
            )
        return inserted

    def add_events(self, events: Sequence[Event], received_at: float) -> int:
        if not events:
            return 0
        rows = [
            (e.device_id, e.seq or None, e.ts, e.kind, e.bundle_id, e.detail, e.progress, received_at) for e in events
        ]
        with self._tx() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO events (device_id, seq, ts, kind, bundle_id, detail, progress, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return db.total_changes - before

    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None
    ) -> list[TelemetryPoint]:
        sql = f"SELECT {_TELEMETRY_COLUMNS} FROM telemetry WHERE device_id = ? AND ts >= ? AND ts < ?"
        params: list[Any] = [device_id, since, until if until is not None else float("inf")]
        if bundle_id is not None:
            sql += " AND bundle_id = ?"
            params.append(bundle_id)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY ts", params).fetchall()
        return [_point(r) for r in rows]

    def latest_telemetry(self) -> dict[str, TelemetryPoint]:
        with self._db() as db:
            rows = db.execute(f"SELECT {_TELEMETRY_COLUMNS} FROM latest_telemetry").fetchall()
        return {r[0]: _point(r) for r in rows}

    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        step = max(step, 1e-3)
        raw = (
            "SELECT CAST(ts / :step AS INTEGER) AS b, COUNT(*), SUM(requests), SUM(errors), SUM(p50_ms),"
            " COUNT(p50_ms), SUM(p95_ms), COUNT(p95_ms), SUM(golden_agreement), COUNT(golden_agreement),"
            " MAX(bundle_id) FROM telemetry WHERE device_id = :d AND ts >= :since AND ts < :until GROUP BY b"
        )
        rolled = (
            "SELECT CAST(bucket / :step AS INTEGER) AS b, SUM(reports), SUM(requests), SUM(errors), SUM(p50_sum),"
            " SUM(p50_n), SUM(p95_sum), SUM(p95_n), SUM(golden_sum), SUM(golden_n), MAX(bundle_id)"
            " FROM telemetry_rollup WHERE device_id = :d AND bucket >= :since AND bucket < :until GROUP BY b"
        )
        params = {"step": step, "d": device_id, "since": since, "until": until}
        merged: dict[int, list[Any]] = {}
        with self._db() as db:
            for sql in (rolled, raw):
                for row in db.execute(sql, params):
                    slot = merged.get(row[0])
                    if slot is None:
                        merged[row[0]] = list(row)
                        continue
                    for i in range(1, 10):
                        slot[i] = (slot[i] or 0) + (row[i] or 0)
                    slot[10] = row[10] or slot[10]

        def avg(total: float | None, count: int | None) -> float | None:
            return round(total / count, 6) if count and total is not None else None

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
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY ts DESC LIMIT ?", [*params, limit]).fetchall()
        return [EventRecord(*r) for r in reversed(rows)]

    def telemetry_count(self, device_id: str | None = None) -> int:
        with self._db() as db:
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
        with self._tx() as db:
            (reports,) = db.execute("SELECT COUNT(*) FROM telemetry WHERE ts < ?", (cutoff,)).fetchone()
            db.execute(
                "INSERT INTO telemetry_rollup (device_id, bucket, bundle_id, reports, requests, errors, p50_sum, p50_n,"
                " p95_sum, p95_n, p95_max, golden_sum, golden_n, golden_min)"
                " SELECT device_id, CAST(ts / :b AS INTEGER) * :b, COALESCE(bundle_id, ''), COUNT(*),"
                " COALESCE(SUM(requests), 0), COALESCE(SUM(errors), 0), SUM(p50_ms), COUNT(p50_ms), SUM(p95_ms),"
                " COUNT(p95_ms), MAX(p95_ms), SUM(golden_agreement), COUNT(golden_agreement), MIN(golden_agreement)"
                " FROM telemetry WHERE ts < :cutoff GROUP BY 1, 2, 3"
                " ON CONFLICT (device_id, bucket, bundle_id) DO UPDATE SET"
                " reports = reports + excluded.reports, requests = requests + excluded.requests,"
                " errors = errors + excluded.errors, p50_sum = COALESCE(p50_sum, 0) + COALESCE(excluded.p50_sum, 0),"
                " p50_n = p50_n + excluded.p50_n, p95_sum = COALESCE(p95_sum, 0) + COALESCE(excluded.p95_sum, 0),"
                " p95_n = p95_n + excluded.p95_n, p95_max = MAX(COALESCE(p95_max, 0), COALESCE(excluded.p95_max, 0)),"
                " golden_sum = COALESCE(golden_sum, 0) + COALESCE(excluded.golden_sum, 0),"
                " golden_n = golden_n + excluded.golden_n,"
                " golden_min = MIN(COALESCE(golden_min, 1), COALESCE(excluded.golden_min, 1))",
                {"b": bucket_s, "cutoff": cutoff},
            )
            deleted_raw = db.execute("DELETE FROM telemetry WHERE ts < ?", (cutoff,)).rowcount
            deleted_rollups = db.execute(
                "DELETE FROM telemetry_rollup WHERE bucket < ?", (now - rollup_retention_s,)
            ).rowcount
            deleted_events = db.execute("DELETE FROM events WHERE ts < ?", (now - event_retention_s,)).rowcount
        return Compaction(int(reports), deleted_raw, deleted_rollups, deleted_events)

    # --- groups and desired state
    def put_group(self, group: GroupDef) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO groups (name, devices_json, selector, priority) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET devices_json = excluded.devices_json,"
                " selector = excluded.selector, priority = excluded.priority",
                (group.name, json.dumps(list(group.devices)), group.selector, group.priority),
            )

    def delete_group(self, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM groups WHERE name = ?", (name,)).rowcount > 0

    def groups(self) -> dict[str, GroupDef]:
        with self._db() as db:
            rows = db.execute("SELECT name, devices_json, selector, priority FROM groups ORDER BY name").fetchall()
        return {r[0]: GroupDef(r[0], tuple(json.loads(r[1])), r[2], int(r[3])) for r in rows}

    def put_deployment(self, deployment: Deployment) -> None:
        d = deployment
        with self._tx() as db:
            db.execute(
                "INSERT INTO deployments (scope, target, profile, bundle_id, model_name, model_version, rollback,"
                " source, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, target, profile) DO UPDATE SET bundle_id = excluded.bundle_id,"
                " model_name = excluded.model_name, model_version = excluded.model_version,"
                " rollback = excluded.rollback, source = excluded.source, updated_at = excluded.updated_at",
                (d.scope, d.target, d.profile, d.bundle_id, d.model_name, d.model_version, int(d.rollback), d.source,
                 d.updated_at or time.time()),
            )  # fmt: skip

    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None) -> int:
        sql, params = "DELETE FROM deployments WHERE scope = ? AND target = ?", [scope, target]
        if profile is not None:
            sql += " AND profile = ?"
            params.append(profile)
        with self._tx() as db:
            return db.execute(sql, params).rowcount

    def deployments(self) -> list[Deployment]:
        with self._db() as db:
            rows = db.execute(
                "SELECT scope, target, profile, bundle_id, model_name, model_version, rollback, source, updated_at"
                " FROM deployments ORDER BY scope, target, profile"
            ).fetchall()
        return [Deployment(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8]) for r in rows]

    def published(self) -> dict[str, PublishedDesired]:
        with self._db() as db:
            rows = db.execute("SELECT device_id, bundle_id, rollback, issued_at FROM published").fetchall()
        return {r[0]: PublishedDesired(r[0], r[1], bool(r[2]), r[3]) for r in rows}

    def set_published(self, device_id: str, published: PublishedDesired | None) -> None:
        with self._tx() as db:
            if published is None:
                db.execute("DELETE FROM published WHERE device_id = ?", (device_id,))
                return
            db.execute(
                "INSERT INTO published (device_id, bundle_id, rollback, issued_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (device_id) DO UPDATE SET bundle_id = excluded.bundle_id,"
                " rollback = excluded.rollback, issued_at = excluded.issued_at",
                (device_id, published.bundle_id, int(published.rollback), published.issued_at),
            )

    def put_bundle(self, bundle: BundleRecord) -> None:
        b = bundle
        with self._tx() as db:
            db.execute(
                "INSERT INTO bundles (bundle_id, model_name, model_version, profile, size, accuracy_budget,"
                " published_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (bundle_id) DO UPDATE SET"
                " size = excluded.size, published_at = excluded.published_at",
                (b.bundle_id, b.model_name, b.model_version, b.profile, b.size, b.accuracy_budget, b.published_at),
            )

    def bundle(self, bundle_id: str) -> BundleRecord | None:
        with self._db() as db:
            row = db.execute(
                "SELECT bundle_id, model_name, model_version, profile, size, accuracy_budget, published_at"
                " FROM bundles WHERE bundle_id = ?",
                (bundle_id,),
            ).fetchone()
        return BundleRecord(*row) if row else None

    # --- rollouts
    def save_rollout(self, row: RolloutRow) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO rollouts (id, state, doc, command, created_at, updated_at) VALUES (?, ?, ?, NULL, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET state = excluded.state, doc = excluded.doc,"
                " updated_at = excluded.updated_at",
                (row.id, row.state, row.doc, row.created_at, row.updated_at),
            )

    def rollouts(self, states: Iterable[str] | None = None) -> list[RolloutRow]:
        sql = "SELECT id, state, doc, created_at, updated_at, command FROM rollouts"
        params: list[Any] = []
        if states is not None:
            wanted = list(states)
            sql += f" WHERE state IN ({', '.join('?' for _ in wanted)})"
            params = wanted
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY created_at", params).fetchall()
        return [RolloutRow(*r) for r in rows]

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        with self._db() as db:
            row = db.execute(
                "SELECT id, state, doc, created_at, updated_at, command FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return RolloutRow(*row) if row else None

    def set_command(self, rollout_id: str, command: str) -> None:
        with self._tx() as db:
            if db.execute("UPDATE rollouts SET command = ? WHERE id = ?", (command, rollout_id)).rowcount == 0:
                known = [r[0] for r in db.execute("SELECT id FROM rollouts ORDER BY created_at DESC LIMIT 20")]
                raise UnknownNameError("rollout", rollout_id, known)

    def take_command(self, rollout_id: str) -> str | None:
        with self._tx() as db:
            row = db.execute("SELECT command FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
            if row is None or row[0] is None:
                return None
            db.execute("UPDATE rollouts SET command = NULL WHERE id = ?", (rollout_id,))
            return str(row[0])

    # --- coordination
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> bool:
        with self._tx() as db:
            db.execute(
                "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at"
                " WHERE leases.holder = excluded.holder OR leases.expires_at < ?",
                (name, holder, now + ttl_s, now),
            )
            row = db.execute("SELECT holder FROM leases WHERE name = ?", (name,)).fetchone()
        return bool(row and row[0] == holder)

    def release_lease(self, name: str, holder: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

    def lease(self, name: str) -> tuple[str, float] | None:
        with self._db() as db:
            row = db.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
        return (str(row[0]), float(row[1])) if row else None

    def add_counters(self, deltas: Mapping[str, int]) -> None:
        items = [(k, v, v) for k, v in deltas.items() if v]
        if not items:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + ?",
                items,
            )

    def counters(self) -> dict[str, int]:
        with self._db() as db:
            return {r[0]: int(r[1]) for r in db.execute("SELECT name, value FROM counters ORDER BY name")}
