"""A rollout's shadow phase: before the first wave, each canary device runs the candidate beside the bundle it
serves (a device-scope deployment of its current bundle with `shadow_bundle_id` = the candidate, published as
its desired state). The device installs the shadow through the same verified path, mirrors a sampled share of
live requests to it, never returns its outputs, and reports a `ShadowReport` (agreement per output with the
served bundle's answers, latency) in its telemetry.

The phase passes when every canary's shadow has mirrored `min_requests` requests for at least `observe_s`,
agrees at least `min_agreement` and keeps its p95 within `max_latency_factor` of the served p95; the shadow
pins are then dropped and the waves begin. A disagreeing or slow shadow, or one without enough mirrored
requests by `timeout_s` ("no data for shadow", unless allowed unjudged), stops the rollout before anything new
was served.
"""

from __future__ import annotations

import statistics
from typing import Literal

from edgefleet.control.rollout.judge.quality import judge_shadow
from edgefleet.control.rollout.judge.wave import breached, pending, settle
from edgefleet.control.rollout.plan import RolloutDoc, ShadowDevice, Tick
from edgefleet.control.store import Deployment, Store

Outcome = Literal["running", "passed", "failed"]


def source(doc: RolloutDoc) -> str:
    return f"shadow:{doc.id}"


def shadow_step(store: Store, doc: RolloutDoc, ctx: Tick) -> Outcome:
    phase, spec = doc.shadow, doc.spec.shadow
    assert phase is not None and spec is not None
    if phase.state == "pending":
        _start(store, doc, ctx)
    elapsed = ctx.now - (phase.started_at or ctx.now) - phase.paused_s
    for device in phase.devices.values():
        if device.state == "running":
            _judge(store, doc, device, elapsed, ctx)
    failed = [d for d in phase.devices.values() if d.state == "failed"]
    if failed:
        first = failed[0]
        phase.state, phase.finished_at = "failed", ctx.now
        phase.verdict = f"{first.device_id}: {first.reason}" + (f" (and {len(failed) - 1} more)" if failed[1:] else "")
        doc.outcome = f"shadow phase failed, nothing was served: {phase.verdict}"
        doc.note(ctx.now, doc.outcome)
        stop_shadow(store, doc, ctx)
        return "failed"
    if all(d.state == "passed" for d in phase.devices.values()):
        phase.state, phase.finished_at = "passed", ctx.now
        phase.verdict = f"passed on {len(phase.devices)} device(s)"
        doc.note(ctx.now, f"shadow phase {phase.verdict}; starting the waves")
        stop_shadow(store, doc, ctx)
        return "passed"
    return "running"


def stop_shadow(store: Store, doc: RolloutDoc, ctx: Tick) -> None:
    """Drop the shadow pins: each device's desired state resolves as before the phase, without the shadow."""
    for pin in store.deployments():
        if pin.scope == "device" and pin.source == source(doc):
            store.delete_deployment("device", pin.target, pin.profile, pin.slot)
            ctx.desired_changed = True


def _start(store: Store, doc: RolloutDoc, ctx: Tick) -> None:
    phase = doc.shadow
    assert phase is not None
    for device in phase.devices.values():
        record = ctx.devices.get(device.device_id)
        bundle = doc.spec.bundle_for(record.profile if record else None)
        if record is None or bundle is None or record.profile is None:
            device.state, device.reason = "failed", "no bundle in this rollout fits the device's profile"
            continue
        slot = record.slot(doc.spec.slot)
        if slot is None or slot.active_bundle is None:
            device.state, device.reason = "failed", "serves no bundle, so a shadow has nothing to be compared with"
            continue
        known = store.bundle(slot.active_bundle)
        name, _, version = (slot.active_model or "").rpartition("@")
        if known is not None:
            name, version = known.model_name, known.model_version
        store.put_deployment(
            Deployment(
                scope="device", target=device.device_id, profile=record.profile, bundle_id=slot.active_bundle,
                model_name=name or bundle.model_name, model_version=version or "0", source=source(doc),
                updated_at=ctx.now, shadow_bundle_id=bundle.bundle_id, slot=doc.spec.slot,
            )
        )  # fmt: skip
        device.state, device.served_bundle = "running", slot.active_bundle
        ctx.desired_changed = True
    phase.state, phase.started_at = "running", ctx.now
    doc.note(ctx.now, f"shadow phase: {len(phase.devices)} canary device(s) run the candidate beside their bundle")


def _judge(store: Store, doc: RolloutDoc, device: ShadowDevice, elapsed: float, ctx: Tick) -> None:
    phase, spec = doc.shadow, doc.spec.shadow
    assert phase is not None and spec is not None and phase.started_at is not None
    record = ctx.devices.get(device.device_id)
    candidate = doc.spec.bundle_for(record.profile if record else None)
    slot = doc.spec.slot
    if record is not None and record.online and record.running(slot) != device.served_bundle:
        device.state, device.reason = "failed", f"left the bundle it served: now runs {record.running(slot)}"
        return
    since = phase.started_at
    reports = [
        q.shadow
        for q in store.quality(device.device_id, since, bundle_id=device.served_bundle, slot=slot)
        if q.shadow is not None and candidate is not None and q.shadow.bundle_id == candidate.bundle_id
    ]
    latest = reports[-1] if reports else None
    served = [
        p.p95_ms
        for p in store.telemetry(device.device_id, since, bundle_id=device.served_bundle, slot=slot)
        if p.p95_ms
    ]
    served_p95 = statistics.median(served) if served else None
    findings = judge_shadow(
        latest, served_p95, min_requests=spec.min_requests, min_agreement=spec.min_agreement,
        max_latency_factor=spec.max_latency_factor, latency_slack_ms=spec.latency_slack_ms,
    )  # fmt: skip
    if elapsed >= spec.timeout_s:
        findings = settle(findings, doc.spec.allow_unjudged)
    device.findings = findings
    device.requests = latest.requests if latest else 0
    device.agreement = latest.agreement if latest else None
    device.shadow_p95_ms = latest.latency.p95_ms if latest and latest.latency else None
    device.served_p95_ms = served_p95
    bad = breached(findings)
    if bad:
        device.state, device.reason = "failed", "; ".join(f.detail for f in bad)
    elif elapsed >= spec.observe_s and not pending(findings):
        device.state, device.reason = "passed", "; ".join(f.detail for f in findings)
