"""An agent-release rollout's steps for one device, in the engine's wave flow (baseline → deploying → observing).

The rollout ships no bundle: each wave's devices are named the release in their desired state (the store's
`agent_release_targets`, signed into every slot's document by the desired publisher), and each is judged by
`judge/agent_release.py`: installed when its agent-committed event and its own status name the release's version,
failed with its own reason on an agent-rolled-back or refused event, then observed on the bundle its rolled-out slot
served before (the baseline, measured before the release was named) under the existing guardrails. How such a
rollout ends (the release stays named, or every touched device is named its previous release or none) is in
finish.py.
"""

from __future__ import annotations

from edgefleet.control.rollout.judge.agent_release import AgentInstall, agent_install, judge_agent_device
from edgefleet.control.rollout.judge.wave import summarize
from edgefleet.control.rollout.plan import AgentReleaseRef, DeviceProgress, RolloutDoc, Tick, WaveProgress
from edgefleet.control.store import AgentReleaseTarget, Store
from edgefleet.core.untrusted import safe_text


def release_of(doc: RolloutDoc) -> AgentReleaseRef:
    if doc.spec.agent_release is None:
        raise ValueError(f"rollout {doc.id} is not an agent-release rollout")
    return doc.spec.agent_release


def start_device(store: Store, doc: RolloutDoc, progress: DeviceProgress, ctx: Tick) -> None:
    """Record what the device runs before the wave touches it: its agent, the release the store named for it (what
    a rollback names again), and the bundle of the rolled-out slot (what its models are judged on)."""
    release = release_of(doc)
    record = ctx.devices.get(progress.device_id)
    if record is None:
        progress.state, progress.reason = "failed", "the store has no status of the device"
        return
    progress.profile = record.profile
    slot = record.slot(doc.spec.slot)
    progress.reported_bundle = progress.target_bundle = slot.active_bundle if slot else None
    progress.previous_agent = record.agent_version
    before = store.agent_releases().get(progress.device_id)
    if before is not None and before.release_id != release.release_id:
        progress.previous_release = AgentReleaseRef(release_id=before.release_id, version=before.version)
    progress.state = "baseline"


def deploy(store: Store, doc: RolloutDoc, progress: DeviceProgress, ctx: Tick) -> None:
    """Name the release in the device's desired state."""
    release = release_of(doc)
    store.put_agent_release(
        AgentReleaseTarget(
            progress.device_id, release.release_id, release.version, release.allow_downgrade_to,
            source=f"rollout:{doc.id}", updated_at=ctx.now,
        )
    )  # fmt: skip
    progress.state, progress.deployed_at = "deploying", ctx.now
    ctx.desired_changed = True


def check_install(store: Store, doc: RolloutDoc, wave: WaveProgress, progress: DeviceProgress, ctx: Tick) -> None:
    release = release_of(doc)
    deployed = progress.deployed_at or ctx.now
    events = store.events(device_id=progress.device_id, received_since=deployed - 1.0)
    install = agent_install(
        release.release_id, release.version, ctx.devices.get(progress.device_id), events,
        deployed_at=deployed, now=ctx.now - wave.paused_s, timeout_s=doc.spec.timing.install_timeout_s,
    )  # fmt: skip
    if install.state in ("failed", "timed-out"):
        progress.state, progress.reason = ("failed" if install.state == "failed" else "timed-out"), install.reason
    elif install.state == "committed":
        progress.state, progress.installed_at = "installed", install.committed_at


def observe(store: Store, doc: RolloutDoc, progress: DeviceProgress, elapsed: float, ctx: Tick) -> None:
    """The slot's bundle under the new agent, against the device's own baseline on it."""
    spec, release = doc.spec, release_of(doc)
    installed = progress.installed_at or 0.0
    device = progress.device_id
    points = store.telemetry(device, installed - 1, bundle_id=progress.target_bundle, slot=spec.slot)
    quality = store.quality(device, installed - 1, bundle_id=progress.target_bundle, slot=spec.slot)
    observed = summarize(
        points, bundle_id=progress.target_bundle, since=installed, fresh_since=None,
        min_fresh_share=spec.thresholds.min_fresh_share, quality=quality,
    )  # fmt: skip
    verdict = judge_agent_device(
        device, release.version, AgentInstall("committed", committed_at=installed), ctx.devices.get(device),
        progress.baseline, observed, spec.thresholds, elapsed_s=elapsed, observe_s=spec.timing.observe_s,
        report_timeout_s=spec.timing.report_timeout_s, min_reports=spec.timing.min_reports,
        allow_unjudged=spec.allow_unjudged,
    )  # fmt: skip
    progress.observed, progress.findings = observed, list(verdict.findings)
    if verdict.state in ("passed", "failed", "timed-out"):
        progress.state = "passed" if verdict.state == "passed" else verdict.state
        progress.reason = safe_text(verdict.reason, 600)


__all__ = ["check_install", "deploy", "observe", "release_of", "start_device"]
