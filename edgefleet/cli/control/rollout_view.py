"""`rollout status ID`: the quality part of a rollout's detail (per-output golden scores, field accuracy, probes,
criteria allowed unjudged, the shadow phase)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefleet.cli.common import fmt, print_table

if TYPE_CHECKING:
    from edgefleet.control.rollout.judge.wave import Metrics
    from edgefleet.control.rollout.plan import RolloutDoc


def _golden(m: Metrics | None) -> str:
    if m is None or not m.golden_scores:
        return ""
    worst = min(m.golden_scores.items(), key=lambda kv: kv[1])
    failed = f" FAIL({', '.join(sorted(m.golden_failed))})" if m.golden_failed else ""
    return f"{worst[1]:.4f} {worst[0]}{failed}"


def _field(m: Metrics | None) -> str:
    if m is None or m.field_accuracy is None:
        return ""
    return f"{m.field_accuracy:.3f} (n={m.field_samples})"


def print_quality(doc: RolloutDoc) -> None:
    if doc.spec.allow_unjudged:
        print(f"allowed unjudged by the operator: {', '.join(doc.spec.allow_unjudged)}")
    devices = sorted(doc.devices.values(), key=lambda p: (p.wave, p.device_id))
    if any(p.observed and (p.observed.golden_scores or p.observed.field_samples or p.observed.probe_requests)
           for p in devices):  # fmt: skip
        print_table(
            "model quality",
            ["device", "golden before", "golden now", "field before", "field now", "probes", "findings"],
            [
                (p.device_id, _golden(p.baseline), _golden(p.observed), _field(p.baseline), _field(p.observed),
                 p.observed.probe_requests if p.observed else "",
                 ", ".join(f"{f.criterion}={'?' if f.ok is None else 'ok' if f.ok else 'FAIL'}" for f in p.findings))
                for p in devices
            ],
        )  # fmt: skip
    shadow = doc.shadow
    if shadow is not None:
        print(f"shadow phase: {shadow.state}{f' ({shadow.verdict})' if shadow.verdict else ''}")
        print_table(
            "shadow vs served",
            ["device", "state", "serves", "mirrored", "agreement", "shadow p95", "served p95", "reason"],
            [
                (d.device_id, d.state, d.served_bundle, d.requests, fmt(d.agreement, 4), fmt(d.shadow_p95_ms),
                 fmt(d.served_p95_ms), d.reason)
                for d in shadow.devices.values()
            ],
        )  # fmt: skip
