"""What the dashboard shows, as JSON: pure functions of the store (any control-plane instance answers alike).

Series carry every metric the store's `SeriesPoint` has (latency percentiles and golden agreement today; field
accuracy and drift once the store records them), so the page plots what there is without a change here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from edgefleet.control.fleet.quality_view import of_point
from edgefleet.control.fleet.registry import group_members, host_view, registry_warnings
from edgefleet.control.health import engine_summary, health_report
from edgefleet.control.rollout.engine import ENGINE_LEASE, load_doc
from edgefleet.control.rollout.finish import can_roll_back
from edgefleet.control.rollout.plan import FAILED_STATES, RolloutDoc
from edgefleet.control.rollout.targets import group_choices, plan_targets
from edgefleet.control.store import DeviceRecord, QualityPoint, SeriesPoint, SlotKey, Store, TelemetryPoint
from edgefleet.core.errors import UnknownNameError
from edgefleet.core.topics import DEFAULT_SLOT
from edgefleet.core.untrusted import safe_text

MAX_GROUP_DEVICES = 200
_COUNTS = ("requests", "errors", "reports")


def _slots(
    d: DeviceRecord, latest: Mapping[SlotKey, TelemetryPoint], quality: Mapping[SlotKey, QualityPoint], now: float
) -> list[dict[str, Any]]:
    """Each slot of a device: its bundle, provider, latency, golden, drift and memory (the device's word and its
    latest report of that slot)."""
    rows = []
    for s in d.slots:
        t, q = latest.get((d.device_id, s.slot)), quality.get((d.device_id, s.slot))
        drift = of_point(q) if q else None
        rows.append(
            {
                "slot": s.slot, "state": s.state, "bundle": s.active_bundle, "model": s.active_model,
                "provider": s.provider_in_use, "verified": s.verified, "slot_class": s.slot_class,
                "latency_objective_ms": s.latency_objective_ms, "memory_mb": s.memory_mb, "refused": s.refused,
                "last_error": s.last_error, "p50_ms": t.p50_ms if t else None, "p95_ms": t.p95_ms if t else None,
                "golden_agreement": t.golden_agreement if t else None, "requests": t.requests if t else None,
                "drift_band": drift.drift_band if drift else None, "drift_psi": drift.drift_psi if drift else None,
                "telemetry_age_s": round(now - t.ts, 1) if t else None,
            }
        )  # fmt: skip
    return rows


def api_fleet(store: Store, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    latest = store.latest_telemetry()
    quality = store.latest_quality()
    generation = {k: q.generation for k, q in quality.items() if q.generation is not None}
    rows = []
    for d in store.devices():
        # The device row's own figures are its first slot's (the default slot for a single model); `slots` has all.
        first = d.slot() or (d.slots[0] if d.slots else None)
        key = (d.device_id, first.slot if first else DEFAULT_SLOT)
        t = latest.get(key)
        g = generation.get(key)
        rows.append(
            {
                "device_id": d.device_id, "online": d.online, "state": d.state, "profile": host_view(d).profile,
                "groups": list(host_view(d).groups), "warnings": registry_warnings(d), "labels": dict(d.labels),
                "bundle": first.active_bundle if first else None, "model": first.active_model if first else None,
                "provider": first.provider_in_use if first else None, "verified": bool(first and first.verified),
                "last_error": d.last_error, "slots": _slots(d, latest, quality, now),
                "agent_version": d.agent_version or None,
                "status_age_s": round(now - d.status_ts, 1),
                "p50_ms": t.p50_ms if t else None, "p95_ms": t.p95_ms if t else None,
                "golden_agreement": t.golden_agreement if t else None, "requests": t.requests if t else None,
                "errors": t.errors if t else None, "cpu_percent": t.cpu_percent if t else None,
                "rss_mb": t.rss_mb if t else None, "telemetry_age_s": round(now - t.ts, 1) if t else None,
                "ttft_p50_ms": g.ttft.p50_ms if g and g.ttft else None,
                "tpot_p50_ms": g.tpot.p50_ms if g and g.tpot else None,
                "tokens_per_s": g.tokens_per_s if g else None,
            }
        )  # fmt: skip
    lease = store.lease(ENGINE_LEASE)
    health = health_report(store, now)
    return {
        "generated_at": now,
        "devices": rows,
        "counters": store.counters(),
        "engine": engine_summary(lease, health, now) if lease else None,
        "health": health,
    }


def _window(window_s: float, points: int, now: float) -> tuple[float, float, float]:
    window_s = min(max(window_s, 10.0), 90 * 86400.0)
    step = max(window_s / max(min(points, 2000), 10), 1.0)
    return now - window_s, now, step


def _point(p: SeriesPoint) -> dict[str, Any]:
    row = dataclasses.asdict(p)
    row["bundle"] = row.pop("bundle_id", None)
    return row


def api_series(store: Store, device_id: str, window_s: float, points: int, now: float | None = None) -> dict[str, Any]:
    since, until, step = _window(window_s, points, time.time() if now is None else now)
    series = store.series(device_id, since, until + step, step)
    return {"device_id": device_id, "since": since, "until": until, "step": step, "points": [_point(p) for p in series]}


def api_group_series(
    store: Store, group: str, window_s: float, points: int, now: float | None = None
) -> dict[str, Any]:
    """A group's history: per step, each metric averaged over the members that reported (p95 also its worst),
    request and error counts summed."""
    since, until, step = _window(window_s, points, time.time() if now is None else now)
    groups, devices = store.groups(), store.devices()
    members = group_members(group, groups, devices)
    if not members and group not in groups:
        raise UnknownNameError("group", group, set(groups) | {g for d in devices for g in d.groups})
    buckets: dict[float, list[dict[str, Any]]] = {}
    for device in members[:MAX_GROUP_DEVICES]:
        for p in store.series(device.device_id, since, until + step, step):
            buckets.setdefault(p.ts, []).append(_point(p))
    rows = []
    for ts, reports in sorted(buckets.items()):
        row: dict[str, Any] = {"ts": ts, "devices": len(reports)}
        for key in reports[0]:
            values = [r[key] for r in reports if isinstance(r.get(key), int | float) and not isinstance(r[key], bool)]
            if key == "ts" or not values:
                continue
            row[key] = sum(values) if key in _COUNTS else round(sum(values) / len(values), 6)
        worst = [r["p95_ms"] for r in reports if r.get("p95_ms") is not None]
        row["p95_ms_max"] = max(worst) if worst else None
        rows.append(row)
    return {"group": group, "members": [d.device_id for d in members], "since": since, "until": until, "step": step,
            "points": rows}  # fmt: skip


def api_groups(store: Store) -> dict[str, Any]:
    """Every group name, with its members; `plannable` and `rollout_members` are the host's records alone (what the
    "Start a rollout" form offers), `left_out` the devices whose own report claims the group, and why they do not
    count. A name only devices' reports use is listed (kind "reported") but is not plannable."""
    groups, devices = store.groups(), store.devices()
    choices = set(group_choices(groups, devices))
    names = sorted(set(groups) | choices | {g for d in devices for g in d.groups})
    rows = []
    for n in names:
        targets = plan_targets(n, groups, devices)
        rows.append({
            "name": safe_text(n, 128), "kind": "host" if n in groups else "enrolled" if n in choices else "reported",
            "selector": groups[n].selector if n in groups else None,
            "members": [d.device_id for d in group_members(n, groups, devices)],
            "plannable": n in choices and bool(targets.members),
            "rollout_members": [d.device_id for d in targets.members],
            "left_out": {d: safe_text(r, 300) for d, r in sorted(targets.left_out.items())},
        })  # fmt: skip
    return {"groups": rows}


def rollout_summary(doc: RolloutDoc) -> dict[str, Any]:
    waves = []
    for wave in doc.waves:
        counts: dict[str, int] = {}
        for device_id in wave.devices:
            state = doc.devices[device_id].state
            counts[state] = counts.get(state, 0) + 1
        waves.append(
            {"index": wave.index, "state": wave.state, "devices": len(wave.devices), "counts": counts,
             "verdict": wave.verdict, "started_at": wave.started_at, "finished_at": wave.finished_at,
             "findings": _wave_findings(doc, wave.devices)}
        )  # fmt: skip
    return {
        "id": doc.id,
        "state": doc.state,
        "active": doc.active,
        "group": doc.spec.group,
        "slot": doc.spec.slot,
        "bundles": [b.bundle_id for b in doc.spec.bundles],
        "agent_release": doc.spec.agent_release.release_id if doc.spec.agent_release else None,
        "created_at": doc.created_at,
        "updated_at": doc.updated_at,
        "finished_at": doc.finished_at,
        "current_wave": doc.current_wave,
        "waves": waves,
        "counts": doc.counts(),
        "outcome": doc.outcome,
        "allow_unjudged": list(doc.spec.allow_unjudged),
        "can_roll_back": can_roll_back(doc),
        "left_out": {d: safe_text(r, 300) for d, r in sorted(doc.left_out.items())},
        "shadow": doc.shadow.model_dump(mode="json", exclude={"devices"}) if doc.shadow else None,
        "log": [entry.model_dump() for entry in doc.log[-12:]],
        "failures": [
            {"device_id": d.device_id, "state": d.state, "reason": d.reason}
            for d in doc.devices.values()
            if d.state in (*FAILED_STATES, "rollback-timed-out")
        ],
    }


def _wave_findings(doc: RolloutDoc, device_ids: list[str]) -> list[dict[str, Any]]:
    """Each device's findings in a wave: what was judged, ok or not, and why."""
    rows = []
    for device_id in device_ids:
        p = doc.devices[device_id]
        rows.append({
            "device_id": device_id, "state": p.state, "reason": safe_text(p.reason, 600),
            "warnings": [safe_text(w, 300) for w in p.warnings],
            "reported_bundle": safe_text(p.reported_bundle, 128) if p.reported_bundle else None,
            "rollback_target": p.previous_bundle, "rollback_note": safe_text(p.rollback_note, 300),
            "baseline_p95_ms": p.baseline.p95_ms if p.baseline else None,
            "p95_ms": p.observed.p95_ms if p.observed else None,
            "golden_agreement": p.observed.golden_agreement if p.observed else None,
            "findings": [f.model_dump() for f in p.findings],
        })  # fmt: skip
    return rows


def api_rollouts(store: Store, limit: int = 20) -> dict[str, Any]:
    rows = sorted(store.rollouts(), key=lambda r: r.created_at)[-limit:]
    return {"rollouts": [rollout_summary(load_doc(row)) for row in reversed(rows)]}


def api_bundles(store: Store) -> dict[str, Any]:
    return {"bundles": [dataclasses.asdict(b) for b in store.bundle_records()]}


def api_desired(store: Store) -> dict[str, Any]:
    order = {"device": 0, "group": 1, "fleet": 2}
    rows = sorted(store.deployments(), key=lambda d: (order[d.scope], d.target, d.profile))
    return {"deployments": [dataclasses.asdict(d) for d in rows]}


def api_audit(store: Store, limit: int = 50) -> dict[str, Any]:
    return {"entries": [dataclasses.asdict(e) | {"detail": dict(e.detail)} for e in store.audit(limit=limit)]}
