"""The store's SQL, shared by the SQLite and PostgreSQL backends: devices, groups, desired state, rollouts, leases.

Telemetry and events are in `store_sql_telemetry`. Rollout-state writes (rollouts, deployments, published
desired state) go through `_fenced_tx`, so a view made by `with_fence` writes them only while its lease term
is current.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edgefleet.control.store import (
    BundleRecord,
    Deployment,
    DeviceRecord,
    GroupDef,
    PublishedDesired,
    RolloutRow,
    Scope,
)
from edgefleet.control.store_sql_operator import OperatorSql
from edgefleet.control.store_sql_telemetry import TelemetrySql
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.messages import DeviceStatus

_DEVICE_COLUMNS = (
    "device_id, online, state, profile, groups_json, labels_json, agent_version, arch, os, hostname, active_bundle, "
    "active_model, provider, verified, last_error, status_ts, first_seen"
)
_KEEP_WHEN_OFFLINE = ("active_bundle", "active_model", "provider", "verified", "last_error")


def _device(row: Sequence[Any]) -> DeviceRecord:
    return DeviceRecord(
        device_id=row[0], online=bool(row[1]), state=row[2], profile=row[3], groups=tuple(json.loads(row[4])),
        labels=json.loads(row[5]), agent_version=row[6] or "", arch=row[7], os=row[8], hostname=row[9],
        active_bundle=row[10], active_model=row[11], provider=row[12], verified=bool(row[13]), last_error=row[14],
        status_ts=row[15], first_seen=row[16],
    )  # fmt: skip


class SqlStore(TelemetrySql, OperatorSql):
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
        rows.sort(key=lambda r: r[0])  # stable: one device's statuses keep their order; no lock-order deadlocks
        kept = ", ".join(
            f"{c} = CASE WHEN excluded.online = 1 THEN excluded.{c} ELSE devices.{c} END" for c in _KEEP_WHEN_OFFLINE
        )
        with self._tx() as db:
            db.executemany(
                "INSERT INTO devices (device_id, online, state, profile, groups_json, agent_version, arch, os,"
                " hostname, active_bundle, active_model, provider, verified, last_error, status_ts, first_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (device_id) DO UPDATE SET online = excluded.online, state = excluded.state,"
                " profile = excluded.profile, groups_json = excluded.groups_json,"
                " agent_version = excluded.agent_version, arch = COALESCE(excluded.arch, devices.arch),"
                " os = COALESCE(excluded.os, devices.os), hostname = COALESCE(excluded.hostname, devices.hostname),"
                f" {kept}, status_ts = excluded.status_ts",
                rows,
            )

    def devices(self) -> list[DeviceRecord]:
        with self._read() as db:
            rows = db.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices ORDER BY device_id").fetchall()
        return [_device(r) for r in rows]

    def device(self, device_id: str) -> DeviceRecord | None:
        with self._read() as db:
            row = db.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)).fetchone()
        return _device(row) if row else None

    def device_ids(self) -> set[str]:
        with self._read() as db:
            return {r[0] for r in db.execute("SELECT device_id FROM devices").fetchall()}

    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        with self._tx() as db:
            row = db.execute(
                f"SELECT labels_json FROM devices WHERE device_id = ?{self.dialect.for_update}", (device_id,)
            ).fetchone()
            if row is None:
                known = [
                    r[0] for r in db.execute("SELECT device_id FROM devices ORDER BY device_id LIMIT 50").fetchall()
                ]
                raise UnknownNameError("device", device_id, known)
            labels = {**json.loads(row[0]), **set_}
            for key in remove:
                labels.pop(key, None)
            db.execute(
                "UPDATE devices SET labels_json = ? WHERE device_id = ?",
                (json.dumps(labels, sort_keys=True), device_id),
            )
        record = self.device(device_id)
        if record is None:
            raise UnknownNameError("device", device_id, self.device_ids())
        return record

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
        with self._read() as db:
            rows = db.execute("SELECT name, devices_json, selector, priority FROM groups ORDER BY name").fetchall()
        return {r[0]: GroupDef(r[0], tuple(json.loads(r[1])), r[2], int(r[3])) for r in rows}

    def put_deployment(self, deployment: Deployment) -> None:
        d = deployment
        with self._fenced_tx() as db:
            db.execute(
                "INSERT INTO deployments (scope, target, profile, bundle_id, model_name, model_version, rollback,"
                " source, updated_at, shadow_bundle_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, target, profile) DO UPDATE SET bundle_id = excluded.bundle_id,"
                " model_name = excluded.model_name, model_version = excluded.model_version,"
                " rollback = excluded.rollback, source = excluded.source, updated_at = excluded.updated_at,"
                " shadow_bundle_id = excluded.shadow_bundle_id",
                (d.scope, d.target, d.profile, d.bundle_id, d.model_name, d.model_version, int(d.rollback), d.source,
                 d.updated_at or time.time(), d.shadow_bundle_id),
            )  # fmt: skip

    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None) -> int:
        sql, params = "DELETE FROM deployments WHERE scope = ? AND target = ?", [scope, target]
        if profile is not None:
            sql += " AND profile = ?"
            params.append(profile)
        with self._fenced_tx() as db:
            return db.execute(sql, params).rowcount

    def deployments(self) -> list[Deployment]:
        with self._read() as db:
            rows = db.execute(
                "SELECT scope, target, profile, bundle_id, model_name, model_version, rollback, source, updated_at,"
                " shadow_bundle_id FROM deployments ORDER BY scope, target, profile"
            ).fetchall()
        return [Deployment(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9]) for r in rows]

    def published(self) -> dict[str, PublishedDesired]:
        with self._read() as db:
            rows = db.execute(
                "SELECT device_id, bundle_id, rollback, issued_at, shadow_bundle_id FROM published"
            ).fetchall()
        return {r[0]: PublishedDesired(r[0], r[1], bool(r[2]), r[3], r[4]) for r in rows}

    def set_published(self, device_id: str, published: PublishedDesired | None) -> None:
        self.set_published_many([(device_id, published)])

    def set_published_many(self, records: Sequence[tuple[str, PublishedDesired | None]]) -> None:
        if not records:
            return
        final = dict(records)  # the last word per device
        cleared = [(d,) for d, p in sorted(final.items()) if p is None]
        latest = {d: p for d, p in final.items() if p is not None}
        with self._fenced_tx() as db:
            db.executemany("DELETE FROM published WHERE device_id = ?", cleared)
            db.executemany(
                "INSERT INTO published (device_id, bundle_id, rollback, issued_at, shadow_bundle_id)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (device_id) DO UPDATE SET bundle_id = excluded.bundle_id,"
                " rollback = excluded.rollback, issued_at = excluded.issued_at,"
                " shadow_bundle_id = excluded.shadow_bundle_id",
                [(d, p.bundle_id, int(p.rollback), p.issued_at, p.shadow_bundle_id) for d, p in sorted(latest.items())],
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
        with self._read() as db:
            row = db.execute(
                "SELECT bundle_id, model_name, model_version, profile, size, accuracy_budget, published_at"
                " FROM bundles WHERE bundle_id = ?",
                (bundle_id,),
            ).fetchone()
        return BundleRecord(*row) if row else None

    # --- rollouts
    def save_rollout(self, row: RolloutRow) -> None:
        with self._fenced_tx() as db:
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
            params = list(states)
            sql += f" WHERE state IN ({', '.join('?' for _ in params)})" if params else " WHERE 1 = 0"
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY created_at", params).fetchall()
        return [RolloutRow(*r) for r in rows]

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        with self._read() as db:
            row = db.execute(
                "SELECT id, state, doc, created_at, updated_at, command FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return RolloutRow(*row) if row else None

    def set_command(self, rollout_id: str, command: str) -> None:
        with self._tx() as db:
            if db.execute("UPDATE rollouts SET command = ? WHERE id = ?", (command, rollout_id)).rowcount == 0:
                known = [
                    r[0] for r in db.execute("SELECT id FROM rollouts ORDER BY created_at DESC LIMIT 20").fetchall()
                ]
                raise UnknownNameError("rollout", rollout_id, known)

    def take_command(self, rollout_id: str) -> str | None:
        with self._fenced_tx() as db:
            row = db.execute(
                f"SELECT command FROM rollouts WHERE id = ?{self.dialect.for_update}", (rollout_id,)
            ).fetchone()
            if row is None or row[0] is None:
                return None
            db.execute("UPDATE rollouts SET command = NULL WHERE id = ?", (rollout_id,))
            return str(row[0])

    # --- coordination
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO leases (name, holder, expires_at, token) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,"
                " token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END"
                " WHERE leases.holder = excluded.holder OR leases.expires_at < ?",
                (name, holder, now + ttl_s, now),
            )
            row = db.execute("SELECT holder, token FROM leases WHERE name = ?", (name,)).fetchone()
        return int(row[1]) if row and row[0] == holder else None

    def release_lease(self, name: str, holder: str) -> None:
        # Keep the row (and its token): a term number must never be handed out twice.
        with self._tx() as db:
            db.execute(
                "UPDATE leases SET holder = '', expires_at = 0, token = token + 1 WHERE name = ? AND holder = ?",
                (name, holder),
            )

    def lease(self, name: str) -> tuple[str, float] | None:
        with self._read() as db:
            row = db.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
        return (str(row[0]), float(row[1])) if row and row[0] else None

    def add_counters(self, deltas: Mapping[str, int]) -> None:
        merged = dict(deltas)
        for name, count in self.write_timings.take().items():
            merged[name] = merged.get(name, 0) + count
        items = sorted((k, v) for k, v in merged.items() if v)
        if not items:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                items,
            )

    def counters(self) -> dict[str, int]:
        with self._read() as db:
            return {r[0]: int(r[1]) for r in db.execute("SELECT name, value FROM counters ORDER BY name").fetchall()}
