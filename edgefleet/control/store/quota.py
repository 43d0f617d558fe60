"""Retention by bytes: no device may hold more than its share of the store, whatever its reports' age.

Age-based retention (compaction) keeps raw reports 6 h and events 30 days; a device inside its ingest budget
(fleet/admission.py: 512 KiB a second) could still fill the store over those windows, so each device's rows in
the three tables its reports grow — `telemetry`, `telemetry_quality` and `events` — are measured in bytes (the
text they hold, plus a fixed cost per row for the numbers and the index entries) and, when a device holds more
than `max_bytes`, its oldest rows are deleted in every table by the same fraction until it holds `KEEP` of it.

The measure is a scan grouped by device (run by the control plane's compaction every `quota_every_s`, 10 min by
default), not a counter kept at insert: it costs nothing on the ingest path, and a device over its quota keeps
it for at most one period.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.control.store.sql.database import Database

KEEP = 0.9  # what a device over its quota is cut back to (so it is not cut again at the next scan)

# table -> (the bytes of its text columns, a fixed cost per row: numbers, keys, index entries)
_TABLES = {
    "telemetry": ("COALESCE(LENGTH(bundle_id), 0) + COALESCE(LENGTH(provider), 0)", 200),
    "telemetry_quality": (
        "LENGTH(golden_json) + LENGTH(drift_json) + COALESCE(LENGTH(shadow_json), 0) + COALESCE(LENGTH(bundle_id), 0)"
        " + COALESCE(LENGTH(golden_task_json), 0) + COALESCE(LENGTH(generation_json), 0)",
        150,
    ),
    "events": ("LENGTH(kind) + LENGTH(detail) + COALESCE(LENGTH(bundle_id), 0)", 120),
}


@dataclass(frozen=True)
class QuotaCut:
    """One device cut back to its quota: how much it held, and the rows deleted per table."""

    device_id: str
    held_bytes: int
    deleted: dict[str, int]


def device_bytes(db: Database) -> dict[str, dict[str, tuple[int, int]]]:
    """device -> table -> (rows, bytes), for every device with rows."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    with db.read() as conn:
        for table, (text_bytes, per_row) in _TABLES.items():
            rows = conn.execute(
                f"SELECT device_id, COUNT(*), COALESCE(SUM({text_bytes}), 0) + COUNT(*) * {per_row}"
                f" FROM {table} GROUP BY device_id"
            ).fetchall()
            for device_id, count, size in rows:
                out.setdefault(str(device_id), {})[table] = (int(count), int(size))
    return out


def enforce_quota(db: Database, max_bytes: int) -> list[QuotaCut]:
    """Cut every device holding more than `max_bytes` back to `KEEP` of it, oldest rows first, in each table by
    the same fraction. Returns the devices cut."""
    cuts = []
    for device_id, tables in sorted(device_bytes(db).items()):
        held = sum(size for _, size in tables.values())
        if held <= max_bytes:
            continue
        keep_fraction = KEEP * max_bytes / held
        deleted: dict[str, int] = {}
        for table, (count, _) in tables.items():
            keep = int(count * keep_fraction)
            with db.tx() as conn:
                if keep == 0:
                    cursor = conn.execute(f"DELETE FROM {table} WHERE device_id = ?", (device_id,))
                else:
                    (cutoff,) = conn.execute(
                        f"SELECT ts FROM {table} WHERE device_id = ? ORDER BY ts DESC LIMIT 1 OFFSET ?",
                        (device_id, keep - 1),
                    ).fetchone()
                    cursor = conn.execute(f"DELETE FROM {table} WHERE device_id = ? AND ts < ?", (device_id, cutoff))
                deleted[table] = int(cursor.rowcount or 0)
        cuts.append(QuotaCut(device_id, held, deleted))
    return cuts


__all__ = ["KEEP", "QuotaCut", "device_bytes", "enforce_quota"]
