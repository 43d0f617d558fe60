"""The dashboard's model-quality panel: `GET /api/quality?window=SECONDS` over the store, drawn by
`web/quality.js`.

Per device, for every bundle it reported on within the window: the latest per-output golden scores (rule,
score, pass), field accuracy with its sample count, and the shadow it ran beside that bundle (agreement and
p95 against the served p95); a field accuracy lower than an earlier bundle's on the same device by more than
`REGRESSION` is flagged. The device's worst drift band now, its drift history (worst PSI per report) for a
sparkline, and per group the same figures aggregated, with the group's worst PSI over time. Recent alerts
(drift-band and golden crossings) last.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from edgefleet.control.fleet.quality_view import of_point
from edgefleet.control.store import QualityPoint, Store, band_rank

REGRESSION = 0.02
_SPARK_POINTS = 120
_GROUP_BUCKETS = 60


def _bundles(points: list[QualityPoint], served_p95: dict[str, float | None]) -> list[dict[str, Any]]:
    by_bundle: dict[str, list[QualityPoint]] = {}
    for p in points:
        by_bundle.setdefault(p.bundle_id or "-", []).append(p)
    result = []
    best_field: float | None = None
    for bundle, reports in sorted(by_bundle.items(), key=lambda kv: kv[1][0].ts):
        golden = next((r.golden for r in reversed(reports) if r.golden), ())
        task = next((r.golden_task for r in reversed(reports) if r.golden_task is not None), None)
        labelled = next((r for r in reversed(reports) if r.field_samples and r.field_accuracy is not None), None)
        shadow = next((r.shadow for r in reversed(reports) if r.shadow is not None), None)
        field = labelled.field_accuracy if labelled else None
        regression = field is not None and best_field is not None and field < best_field - REGRESSION
        if field is not None:
            best_field = field if best_field is None else max(best_field, field)
        result.append(
            {
                "bundle": bundle, "since": reports[0].ts, "until": reports[-1].ts,
                "golden": [{"output": s.output, "rule": s.rule, "score": s.score, "passed": s.passed} for s in golden],
                "golden_task": task.model_dump(mode="json") if task else None,
                "field_accuracy": field, "field_samples": labelled.field_samples if labelled else 0,
                "field_regression": regression,
                "shadow": None if shadow is None else {
                    "bundle": shadow.bundle_id, "requests": shadow.requests, "agreement": shadow.agreement,
                    "passed": all(s.passed for s in shadow.per_output),
                    "p95_ms": shadow.latency.p95_ms if shadow.latency else None,
                    "served_p95_ms": served_p95.get(bundle),
                },
            }
        )  # fmt: skip
    return result


def _worst_over_time(points: list[list[float]]) -> list[list[float]]:
    """A group's worst PSI per time bucket (`_GROUP_BUCKETS` over the span its devices reported)."""
    if not points:
        return []
    first, last = min(p[0] for p in points), max(p[0] for p in points)
    width = max((last - first) / _GROUP_BUCKETS, 1e-3)
    worst: dict[int, float] = {}
    for ts, psi in points:
        bucket = min(int((ts - first) / width), _GROUP_BUCKETS - 1)
        worst[bucket] = max(psi, worst.get(bucket, 0.0))
    return [[first + (b + 0.5) * width, v] for b, v in sorted(worst.items())]


def api_quality(store: Store, window_s: float = 900.0, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    window_s = min(max(window_s, 10.0), 7 * 86400.0)
    since = now - window_s
    devices: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    for record in store.devices():
        points = store.quality(record.device_id, since)
        if not points:
            continue
        latest = of_point(points[-1])
        p95 = {}
        for bundle in {p.bundle_id for p in points if p.shadow is not None}:
            values = [t.p95_ms for t in store.telemetry(record.device_id, since, bundle_id=bundle) if t.p95_ms]
            p95[bundle or "-"] = round(statistics.median(values), 4) if values else None
        drifting = [p for p in points if p.drift]
        step = max(1, len(drifting) // _SPARK_POINTS)
        drift_series = [[p.ts, max(d.psi for d in p.drift)] for p in drifting[::step]]
        row: dict[str, Any] = {
            "device_id": record.device_id, "groups": list(record.groups), "bundle": record.running(),
            "slots": {s.slot: s.active_bundle for s in record.slots},
            "drift_band": latest.drift_band, "drift_psi": latest.drift_psi, "drift_name": latest.drift_name,
            "drift_series": drift_series,
            "bundles": _bundles(points, p95),
        }  # fmt: skip
        devices.append(row)
        for group in record.groups or ("(no group)",):
            g = groups.setdefault(
                group, {"group": group, "devices": 0, "golden_min": None, "field": [], "bands": [], "psi": []}
            )
            g["psi"].extend(drift_series)
            g["devices"] += 1
            if latest.golden_min is not None:
                g["golden_min"] = min(latest.golden_min, g["golden_min"] if g["golden_min"] is not None else 1.0)
            if latest.field_accuracy is not None:
                g["field"].append(latest.field_accuracy)
            if latest.drift_band is not None:
                g["bands"].append(latest.drift_band)
    group_rows = [
        {
            "group": g["group"], "devices": g["devices"], "golden_min": g["golden_min"],
            "field_accuracy": round(statistics.fmean(g["field"]), 4) if g["field"] else None,
            "drift_worst": max(g["bands"], key=band_rank) if g["bands"] else None,
            "drifting": sum(1 for b in g["bands"] if b != "none"),
            "drift_series": _worst_over_time(g["psi"]),
        }
        for g in sorted(groups.values(), key=lambda g: g["group"])
    ]  # fmt: skip
    alerts = [
        {"device_id": a.device_id, "ts": a.ts, "kind": a.kind, "level": a.level, "subject": a.subject,
         "bundle": a.bundle_id, "detail": a.detail}
        for a in store.alerts(since=since, limit=50)
    ]  # fmt: skip
    return {"generated_at": now, "window_s": window_s, "devices": devices, "groups": group_rows, "alerts": alerts}
