"""The devices repository: the registry of devices (each one's last status and the operator's labels) and the
host-side groups.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from edgefleet.control.store.records import DeviceRecord, GroupDef
from edgefleet.control.store.sql.database import Database, unit_of_work
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.messages import DeviceStatus, SlotStatus

_DEVICE_COLUMNS = (
    "device_id, online, state, profile, groups_json, labels_json, agent_version, arch, os, hostname, slots_json, "
    "last_error, status_ts, first_seen"
)
_KEEP_WHEN_OFFLINE = ("slots_json", "last_error")


class Devices(Protocol):
    """Devices as their statuses and the operator's labels describe them, and the host-side groups."""

    def upsert_statuses(self, statuses: Sequence[DeviceStatus], received_at: float) -> None:
        """Record each device's latest status in arrival order (the broker orders one topic's messages).

        An offline status (the last will) keeps what the device last ran: the will carries no slots."""
        ...

    def devices(self) -> list[DeviceRecord]: ...

    def device(self, device_id: str) -> DeviceRecord | None: ...

    def device_ids(self) -> set[str]: ...

    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        """Operator labels; an unknown device raises UnknownNameError."""
        ...

    def put_group(self, group: GroupDef) -> None: ...

    def delete_group(self, name: str) -> bool: ...

    def groups(self) -> dict[str, GroupDef]: ...


def _device(row: Sequence[Any]) -> DeviceRecord:
    return DeviceRecord(
        device_id=row[0], online=bool(row[1]), state=row[2], profile=row[3], groups=tuple(json.loads(row[4])),
        labels=json.loads(row[5]), agent_version=row[6] or "", arch=row[7], os=row[8], hostname=row[9],
        slots=tuple(SlotStatus.model_validate(s) for s in json.loads(row[10])), last_error=row[11],
        status_ts=row[12], first_seen=row[13],
    )  # fmt: skip


def _slots_json(status: DeviceStatus) -> str:
    return json.dumps([s.model_dump(mode="json") for s in status.slots])


class SqlDevices:
    def __init__(self, db: Database) -> None:
        self.db = db

    @unit_of_work()
    def upsert_statuses(self, statuses: Sequence[DeviceStatus], received_at: float) -> None:
        rows = []
        for s in statuses:
            hw = s.hardware
            rows.append((
                s.device_id, int(s.online), s.state, s.profile, json.dumps(s.groups), s.agent_version,
                hw.arch if hw else None, hw.os if hw else None, hw.hostname if hw else None, _slots_json(s),
                s.last_error, s.ts if s.online else received_at, received_at,
            ))  # fmt: skip
        if not rows:
            return
        rows.sort(key=lambda r: r[0])  # stable: one device's statuses keep their order; no lock-order deadlocks
        kept = ", ".join(
            f"{c} = CASE WHEN excluded.online = 1 THEN excluded.{c} ELSE devices.{c} END" for c in _KEEP_WHEN_OFFLINE
        )
        with self.db.tx() as conn:
            conn.executemany(
                "INSERT INTO devices (device_id, online, state, profile, groups_json, agent_version, arch, os,"
                " hostname, slots_json, last_error, status_ts, first_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (device_id) DO UPDATE SET online = excluded.online, state = excluded.state,"
                " profile = excluded.profile, groups_json = excluded.groups_json,"
                " agent_version = excluded.agent_version, arch = COALESCE(excluded.arch, devices.arch),"
                " os = COALESCE(excluded.os, devices.os), hostname = COALESCE(excluded.hostname, devices.hostname),"
                f" {kept}, status_ts = excluded.status_ts",
                rows,
            )

    @unit_of_work()
    def devices(self) -> list[DeviceRecord]:
        with self.db.read() as conn:
            rows = conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices ORDER BY device_id").fetchall()
        return [_device(r) for r in rows]

    @unit_of_work()
    def device(self, device_id: str) -> DeviceRecord | None:
        with self.db.read() as conn:
            row = conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)).fetchone()
        return _device(row) if row else None

    @unit_of_work()
    def device_ids(self) -> set[str]:
        with self.db.read() as conn:
            return {r[0] for r in conn.execute("SELECT device_id FROM devices").fetchall()}

    @unit_of_work()
    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        with self.db.tx() as conn:
            row = conn.execute(
                f"SELECT labels_json FROM devices WHERE device_id = ?{self.db.dialect.for_update}", (device_id,)
            ).fetchone()
            if row is None:
                known = [
                    r[0] for r in conn.execute("SELECT device_id FROM devices ORDER BY device_id LIMIT 50").fetchall()
                ]
                raise UnknownNameError("device", device_id, known)
            labels = {**json.loads(row[0]), **set_}
            for key in remove:
                labels.pop(key, None)
            conn.execute(
                "UPDATE devices SET labels_json = ? WHERE device_id = ?",
                (json.dumps(labels, sort_keys=True), device_id),
            )
            found = conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)).fetchone()
        return _device(found)

    @unit_of_work()
    def put_group(self, group: GroupDef) -> None:
        with self.db.tx() as conn:
            conn.execute(
                "INSERT INTO groups (name, devices_json, selector, priority) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET devices_json = excluded.devices_json,"
                " selector = excluded.selector, priority = excluded.priority",
                (group.name, json.dumps(list(group.devices)), group.selector, group.priority),
            )

    @unit_of_work()
    def delete_group(self, name: str) -> bool:
        with self.db.tx() as conn:
            return conn.execute("DELETE FROM groups WHERE name = ?", (name,)).rowcount > 0

    @unit_of_work()
    def groups(self) -> dict[str, GroupDef]:
        with self.db.read() as conn:
            rows = conn.execute("SELECT name, devices_json, selector, priority FROM groups ORDER BY name").fetchall()
        return {r[0]: GroupDef(r[0], tuple(json.loads(r[1])), r[2], int(r[3])) for r in rows}
