"""The quality repository: per-report golden scores, field accuracy, drift and shadow figures, and the alerts
raised when a device crosses a drift band or its golden check turns.

Schema (`migrations/<dialect>/0003_model_quality.sql`; JSON lists as text on both backends):
- `telemetry_quality`: one row per report that carries quality figures, deduplicated like `telemetry` by
  (device_id, seq, ts); headline columns for queries (`golden_min`, `golden_failed`, `drift_max`,
  `shadow_agreement`) and the per-output / per-input lists as JSON.
- `quality_state`: each device's last drift band per input/output and golden verdict per output (what a
  crossing is measured against).
- `alerts`: the crossings, as control-plane events.

Rows are written by `add_in`, inside the transaction that stores the reports (the reports repository calls
it): a report and its quality figures are stored (and acknowledged) together or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from edgefleet.control.store.quality_alerts import QualityAlert, subject_states, transitions
from edgefleet.control.store.records import AlertRecord, QualityPoint, SlotKey
from edgefleet.control.store.sql.database import Database, Db, delete_batched, device_window, unit_of_work
from edgefleet.core.messages import DriftScore, GenerationStats, GoldenTask, OutputScore, ShadowReport, Telemetry
from edgefleet.core.topics import DEFAULT_SLOT
from edgefleet.core.untrusted import safe_text

log = logging.getLogger(__name__)

_COLUMNS = (
    "device_id, seq, ts, bundle_id, field_accuracy, field_samples, probe_requests, golden_json, drift_json,"
    " shadow_json, golden_task_json, generation_json, slot"
)


class Quality(Protocol):
    """Model-quality figures of the reports, and the alerts their crossings raised."""

    def quality(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[QualityPoint]:  # fmt: skip
        """Quality figures of one device's reports in [since, until), oldest first (of one bundle, of one slot)."""
        ...

    def latest_quality(self) -> dict[SlotKey, QualityPoint]:
        """Each (device, slot)'s latest report that carried quality figures."""
        ...

    def alerts(self, device_id: str | None = None, since: float = 0.0, limit: int = 1000) -> list[AlertRecord]:
        """Drift-band and golden-check crossings and the control plane's own alerts about a device (over its
        ingest budget), oldest first (the newest `limit`); `since` on device clocks."""
        ...

    def add_alerts(self, alerts: Sequence[AlertRecord], received_at: float) -> None:
        """Alerts the control plane raises about a device itself (not from a report's figures)."""
        ...


SLOT_SUBJECT = "slot="


def slot_prefix(slot: str) -> str:
    """How a slot's quality subjects are kept (drift bands, golden verdicts): as they are for the default slot
    (so a store from before slots keeps its states), `slot=NAME|` before them for any other."""
    return "" if slot == DEFAULT_SLOT else f"{SLOT_SUBJECT}{slot}|"


def has_quality(t: Telemetry) -> bool:
    return bool(
        t.golden_scores or t.golden_task or t.drift or t.shadow or t.field_samples or t.probe_requests or t.generation
    )


def _row(t: Telemetry, received_at: float) -> tuple[Any, ...]:
    golden = [s.score for s in t.golden_scores]
    return (
        t.device_id, t.seq or None, t.ts, t.bundle_id, t.field_accuracy, t.field_samples, t.probe_requests,
        min(golden) if golden else None, sum(1 for s in t.golden_scores if not s.passed),
        max((d.psi for d in t.drift), default=None), t.shadow.agreement if t.shadow else None,
        json.dumps([s.model_dump(mode="json") for s in t.golden_scores]),
        json.dumps([d.model_dump(mode="json") for d in t.drift]),
        t.shadow.model_dump_json() if t.shadow else None, received_at,
        t.golden_task.model_dump_json() if t.golden_task else None,
        t.generation.model_dump_json() if t.generation else None, t.slot,
    )  # fmt: skip


def _point(row: Sequence[Any]) -> QualityPoint:
    return QualityPoint(
        device_id=row[0], seq=row[1], ts=row[2], bundle_id=row[3], field_accuracy=row[4],
        field_samples=int(row[5]), probe_requests=int(row[6]),
        golden=tuple(OutputScore.model_validate(g) for g in json.loads(row[7])),
        drift=tuple(DriftScore.model_validate(d) for d in json.loads(row[8])),
        shadow=ShadowReport.model_validate_json(row[9]) if row[9] else None,
        golden_task=GoldenTask.model_validate_json(row[10]) if row[10] else None,
        generation=GenerationStats.model_validate_json(row[11]) if row[11] else None, slot=row[12],
    )  # fmt: skip


class SqlQuality:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add_in(self, conn: Db, reports: Sequence[Telemetry], received_at: float) -> list[QualityAlert]:
        """Store the quality figures of new reports and raise an alert for every crossing, inside the caller's
        transaction. Repeats (same device, seq and ts) are skipped, so they raise nothing twice."""
        raised: list[QualityAlert] = []
        for report in sorted((r for r in reports if has_quality(r)), key=lambda r: r.ts):
            inserted = conn.execute(
                "INSERT INTO telemetry_quality (device_id, seq, ts, bundle_id, field_accuracy, field_samples,"
                " probe_requests, golden_min, golden_failed, drift_max, shadow_agreement, golden_json, drift_json,"
                " shadow_json, received_at, golden_task_json, generation_json, slot)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                _row(report, received_at),
            ).rowcount
            if not inserted:
                continue
            prefix = slot_prefix(report.slot)  # each slot's subjects are its own: two models' "input" never mix
            states = {
                subject[len(prefix) :]: (state, ts)
                for subject, state, ts in conn.execute(
                    "SELECT subject, state, ts FROM quality_state WHERE device_id = ?", (report.device_id,)
                ).fetchall()
                if (subject.startswith(prefix) if prefix else not subject.startswith(SLOT_SUBJECT))
            }
            current = {subject: state for subject, (state, ts) in states.items() if ts <= report.ts}
            stale = {subject for subject, (_, ts) in states.items() if ts > report.ts}  # a late report: no verdict
            found = [
                dataclasses.replace(
                    a, subject=prefix + a.subject, detail=f"slot {report.slot}: {a.detail}" if prefix else a.detail
                )
                for a in transitions(report, current)
                if a.subject not in stale
            ]
            conn.executemany(
                "INSERT INTO quality_state (device_id, subject, state, ts) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (device_id, subject) DO UPDATE SET state = excluded.state, ts = excluded.ts"
                " WHERE excluded.ts >= quality_state.ts",
                [(report.device_id, prefix + subject, state, report.ts)
                 for subject, state in subject_states(report).items()],
            )  # fmt: skip
            conn.executemany(
                "INSERT INTO alerts (device_id, ts, kind, subject, level, bundle_id, detail, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(a.device_id, a.ts, a.kind, a.subject, a.level, a.bundle_id, a.detail, received_at) for a in found],
            )
            raised += found
        for alert in raised:
            log.warning("%s %s: %s", safe_text(alert.device_id), alert.level, safe_text(alert.detail, 400))
        return raised

    def expire(self, reports_before: float, alerts_before: float) -> None:
        """Quality rows live as long as raw reports, alerts as long as events (compaction calls it)."""
        delete_batched(self.db, "telemetry_quality", "ts < ?", reports_before)
        delete_batched(self.db, "alerts", "ts < ?", alerts_before)

    @unit_of_work()
    def quality(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[QualityPoint]:  # fmt: skip
        sql, params = device_window("telemetry_quality", _COLUMNS, device_id, since, until, bundle_id, slot)
        with self.db.read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_point(r) for r in rows]

    @unit_of_work()
    def latest_quality(self) -> dict[SlotKey, QualityPoint]:
        """One indexed lookup per known device and slot it reported (a scan of every report would grow with
        retention)."""
        with self.db.read() as conn:
            slots = {
                (device_id, slot)
                for device_id, slots_json in conn.execute("SELECT device_id, slots_json FROM devices").fetchall()
                for slot in {DEFAULT_SLOT, *(s.get("slot", DEFAULT_SLOT) for s in json.loads(slots_json))}
            }
            rows = [
                row
                for device_id, slot in sorted(slots)
                for row in conn.execute(
                    f"SELECT {_COLUMNS} FROM telemetry_quality WHERE device_id = ? AND slot = ? ORDER BY ts DESC"
                    " LIMIT 1",
                    (device_id, slot),
                ).fetchall()
            ]
        return {(r[0], r[12]): _point(r) for r in rows}

    @unit_of_work()
    def add_alerts(self, alerts: Sequence[AlertRecord], received_at: float) -> None:
        if not alerts:
            return
        with self.db.tx() as conn:
            conn.executemany(
                "INSERT INTO alerts (device_id, ts, kind, subject, level, bundle_id, detail, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(a.device_id, a.ts, a.kind, a.subject, a.level, a.bundle_id, a.detail, received_at) for a in alerts],
            )
        for alert in alerts:
            log.warning("%s %s: %s", safe_text(alert.device_id), alert.level, safe_text(alert.detail, 400))

    @unit_of_work()
    def alerts(self, device_id: str | None = None, since: float = 0.0, limit: int = 1000) -> list[AlertRecord]:
        sql = "SELECT device_id, ts, kind, subject, level, bundle_id, detail FROM alerts WHERE ts >= ?"
        params: list[Any] = [since]
        if device_id is not None:
            sql += " AND device_id = ?"
            params.append(device_id)
        order = f" ORDER BY ts DESC, {self.db.dialect.insert_order} DESC LIMIT ?"
        with self.db.read() as conn:
            rows = conn.execute(sql + order, [*params, limit]).fetchall()
        return [AlertRecord(*r) for r in reversed(rows)]
