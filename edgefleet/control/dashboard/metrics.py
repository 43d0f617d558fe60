"""The dashboard's `/metrics` page (Prometheus text format 0.0.4): the control plane's loops, its counters, and
the dashboard server's own.

    edgefleet_control_engine_running                        1 when the lease is live and no loop of its holder stalled
    edgefleet_control_loop_active{instance,loop}            1 where the loop runs (the lease holder)
    edgefleet_control_loop_stalled{instance,loop}           1 after 3 intervals without completing (health.py)
    edgefleet_control_loop_errors_per_minute{instance,loop}
    edgefleet_control_loop_last_completed_age_seconds{instance,loop}   absent when it never completed
    edgefleet_control_counter_total{counter}                the store's counters (ingest.*: stored, refused, ...)
    edgefleet_dashboard_connections_closed_total{reason}    idle or slow requests the server closed (server.py)
    edgefleet_dashboard_throttled_total                     attempts answered 429 by this process's throttle
    edgefleet_ingest_backlog_messages                       this instance: received, not stored yet
    edgefleet_ingest_backlog_oldest_seconds                 this instance: how long the oldest has waited
    edgefleet_device_time_to_first_token_seconds{device,slot,bundle}   language models: the last report's TTFT p50
    edgefleet_device_time_per_output_token_seconds{device,slot,bundle} ... its TPOT p50
    edgefleet_device_output_tokens_per_second{device,slot,bundle}      ... output tokens / decode time
    edgefleet_device_slot_info{device,slot,bundle,provider,state}      1 per slot a device reports (its model)
    edgefleet_device_slot_verified{device,slot}                        1 when the slot's bundle passed its checks
    edgefleet_device_slot_latency_p95_seconds{device,slot}             the slot's last report's p95
    edgefleet_device_slot_latency_objective_seconds{device,slot}       a real-time slot's p95 objective
    edgefleet_device_slot_golden_agreement{device,slot}                the slot's last report's golden agreement
    edgefleet_device_slot_drift_psi{device,slot}                       the slot's last quality report's worst drift
    edgefleet_device_slot_memory_bytes{device,slot}                    what the slot's model holds on the device
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from edgefleet.control.health import engine_summary, health_report
from edgefleet.control.rollout.engine import ENGINE_LEASE
from edgefleet.control.store import Store
from edgefleet.core.messages import GenerationStats, LatencySummary

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(lines: list[str], name: str, kind: str, text: str) -> None:
    lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


_LOCAL = {
    "ingest_backlog_messages": "messages this instance received and has not stored yet",
    "ingest_backlog_oldest_seconds": "how long the oldest of them has waited",
}


_GENERATION = {
    "time_to_first_token_seconds": "time to first token, median of the last report (gen_ai.server.time_to_first_token)",
    "time_per_output_token_seconds": "time per output token, median of the last report "
    "(gen_ai.server.time_per_output_token)",
    "output_tokens_per_second": "output tokens per second of decoding in the last report",
}


def _figures(g: GenerationStats) -> dict[str, float | None]:
    def seconds(summary: LatencySummary | None) -> float | None:
        return summary.p50_ms / 1000 if summary is not None and summary.p50_ms is not None else None

    return {
        "time_to_first_token_seconds": seconds(g.ttft),
        "time_per_output_token_seconds": seconds(g.tpot),
        "output_tokens_per_second": g.tokens_per_s,
    }


def _generation(lines: list[str], store: Store) -> None:
    """Per device serving a language model, its last report's token figures."""
    latest = sorted((k, q) for k, q in store.latest_quality().items() if q.generation is not None)
    for suffix, text in _GENERATION.items():
        name = f"edgefleet_device_{suffix}"
        _family(lines, name, "gauge", text)
        for (device, slot), q in latest:
            figure = _figures(q.generation)[suffix] if q.generation is not None else None
            if figure is not None:
                labels = f'device="{_label(device)}",slot="{_label(slot)}",bundle="{_label(q.bundle_id)}"'
                lines.append(f"{name}{{{labels}}} {figure:.6g}")


_SLOT = {
    "slot_verified": "1 when the slot's bundle passed its signature and golden checks",
    "slot_latency_p95_seconds": "p95 latency of the slot's last report",
    "slot_latency_objective_seconds": "a real-time slot's p95 latency objective",
    "slot_golden_agreement": "golden agreement of the slot's last report",
    "slot_drift_psi": "worst input/output drift (PSI) of the slot's last quality report",
    "slot_memory_bytes": "memory the slot's model holds, measured on the device",
}


def _slots(lines: list[str], store: Store) -> None:
    """Per device and slot: what it runs, and its figures (absent where the device or its reports say nothing)."""
    latest, quality = store.latest_telemetry(), store.latest_quality()
    slots = [(d.device_id, s) for d in store.devices() for s in d.slots]
    name = "edgefleet_device_slot_info"
    _family(lines, name, "gauge", "1 per slot a device reports: the bundle it runs, on which provider, its state")
    for device, s in slots:
        labels = (
            f'device="{_label(device)}",slot="{_label(s.slot)}",bundle="{_label(s.active_bundle or "")}",'
            f'provider="{_label(s.provider_in_use or "")}",state="{_label(s.state)}"'
        )
        lines.append(f"{name}{{{labels}}} 1")
    for suffix, text in _SLOT.items():
        name = f"edgefleet_device_{suffix}"
        _family(lines, name, "gauge", text)
        for device, s in slots:
            t, q = latest.get((device, s.slot)), quality.get((device, s.slot))
            psi = max((d.psi for d in q.drift), default=None) if q else None
            figure = {
                "slot_verified": float(s.verified),
                "slot_latency_p95_seconds": t.p95_ms / 1000 if t and t.p95_ms is not None else None,
                "slot_latency_objective_seconds": s.latency_objective_ms / 1000 if s.latency_objective_ms else None,
                "slot_golden_agreement": t.golden_agreement if t else None,
                "slot_drift_psi": psi,
                "slot_memory_bytes": s.memory_mb * 1024 * 1024 if s.memory_mb is not None else None,
            }[suffix]
            if figure is not None:
                lines.append(f'{name}{{device="{_label(device)}",slot="{_label(s.slot)}"}} {figure:.6g}')


def metrics_page(
    store: Store, server_stats: Mapping[str, int], throttled: int, local: Mapping[str, float] | None = None
) -> tuple[bytes, str]:
    """The page; `local`: this process's own gauges (`_LOCAL`: the control plane's ingest backlog)."""
    now = time.time()
    report = health_report(store, now)
    engine = engine_summary(store.lease(ENGINE_LEASE), report, now)
    lines: list[str] = []
    _family(lines, "edgefleet_control_engine_running", "gauge", "1 when the rollout engine runs and no loop stalled")
    lines.append(f"edgefleet_control_engine_running {int(engine['state'] == 'running')}")
    per_loop = [
        ("active", "1 where the loop runs now", lambda r: int(bool(r["active"]))),
        ("stalled", "1 when the loop has not completed for 3 intervals", lambda r: int(r["state"] == "stalled")),
        ("errors_per_minute", "errors the loop caught in the last minute", lambda r: r["errors_per_min"]),
    ]
    for suffix, text, value in per_loop:
        name = f"edgefleet_control_loop_{suffix}"
        _family(lines, name, "gauge", text)
        for r in report:
            lines.append(f'{name}{{instance="{_label(r["instance"])}",loop="{_label(r["component"])}"}} {value(r)}')
    name = "edgefleet_control_loop_last_completed_age_seconds"
    _family(lines, name, "gauge", "seconds since the loop last completed")
    for r in report:
        if r["last_tick"] is not None:
            age = max(0.0, now - float(r["last_tick"]))  # type: ignore[arg-type]
            lines.append(f'{name}{{instance="{_label(r["instance"])}",loop="{_label(r["component"])}"}} {age:.3f}')
    name = "edgefleet_control_counter_total"
    _family(lines, name, "counter", "the control plane's counters in the store")
    for counter, count in sorted(store.counters().items()):
        lines.append(f'{name}{{counter="{_label(counter)}"}} {int(count)}')
    name = "edgefleet_dashboard_connections_closed_total"
    _family(lines, name, "counter", "connections the dashboard server closed before a whole request arrived")
    for reason in ("request_deadline",):
        lines.append(f'{name}{{reason="{reason}"}} {int(server_stats.get(reason, 0))}')
    _family(lines, "edgefleet_dashboard_throttled_total", "counter", "attempts answered 429 by the throttle")
    lines.append(f"edgefleet_dashboard_throttled_total {int(throttled)}")
    _generation(lines, store)
    _slots(lines, store)
    for key, gauge in sorted((local or {}).items()):
        if key in _LOCAL:
            _family(lines, f"edgefleet_{key}", "gauge", _LOCAL[key])
            lines.append(f"edgefleet_{key} {gauge:g}")
    return ("\n".join(lines) + "\n").encode(), CONTENT_TYPE
