"""The rollout engine: drives every active rollout one step per tick, all state in the store.

Each wave goes baseline → deploying → observing → passed/failed:
- baseline: the telemetry each device sent on the bundle it runs now, over the last `baseline_s`
  (waits up to `baseline_s` for `min_reports` reports; a device with no bundle has no baseline);
- deploying: a device-scope deployment per device (published as its retained desired topic); a device
  is installed once its status shows the bundle active and verified (golden set passed on the device);
  a `refused`, `rolled-back` or `health-failed` event fails it, silence past `install_timeout_s` times it out;
- observing: reports sent wholly after the commit are judged against the baseline (`judge.judge_device`);
  a breach fails the device at once, a device passes after `observe_s` with `min_reports` reports and
  nothing left pending; no reports by `observe_s + report_timeout_s` times it out.
More than `max_failed_devices` failures fail the wave, and a failed wave rolls back every device the
rollout touched: each is pinned to the bundle it ran before, with the rollback flag the agents require.
When the last wave passes, the bundles become the group's deployment (the device pins are dropped where
the group's deployment now resolves to the same bundle).

Every tick loads each active rollout from the store, applies a pending command (pause, resume, abort),
steps it and saves it: a restarted control plane carries on where the last one stopped. Only the holder
of the engine lease (one process among several sharing a store) runs ticks.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from edgefleet.control.desired import DesiredPublisher, plan_desired
from edgefleet.control.judge import breached, judge_device, pending, summarize
from edgefleet.control.registry import require_members
from edgefleet.control.rollout import (
    ACTIVE_STATES,
    BundleRef,
    DeviceProgress,
    RolloutDoc,
    RolloutSpec,
    RolloutSpecError,
    RolloutState,
    WaveProgress,
    order_devices,
    plan_waves,
)
from edgefleet.control.store import Deployment, DeviceRecord, EventRecord, RolloutRow, Store, TelemetryPoint
from edgefleet.core.manifest import Manifest

log = logging.getLogger(__name__)

ENGINE_LEASE = "rollout-engine"
FAILING_EVENTS = ("refused", "rolled-back", "health-failed")


def make_spec(**fields: Any) -> RolloutSpec:
    """A RolloutSpec, or a RolloutSpecError that says every problem in one line."""
    try:
        return RolloutSpec(**fields)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            where = ".".join(map(str, error["loc"]))
            problems.append(f"{where}: {message}" if where else message)
        raise RolloutSpecError("invalid rollout: " + "; ".join(problems)) from err


def bundle_ref(manifest: Manifest) -> BundleRef:
    return BundleRef(
        bundle_id=manifest.bundle_id,
        model_name=manifest.model_name,
        model_version=manifest.model_version,
        profile=manifest.profile,
        accuracy_budget=manifest.accuracy.budget,
    )


def to_row(doc: RolloutDoc) -> RolloutRow:
    return RolloutRow(doc.id, doc.state, doc.model_dump_json(), doc.created_at, doc.updated_at)


def load_doc(row: RolloutRow) -> RolloutDoc:
    return RolloutDoc.model_validate_json(row.doc)


def prepare_rollout(store: Store, spec: RolloutSpec, *, now: float | None = None) -> RolloutDoc:
    """Check the rollout against the registry, plan its waves and save it (state pending)."""
    now = time.time() if now is None else now
    devices = store.devices()
    if not devices:
        raise RolloutSpecError(
            f"the store {store.url} knows no device yet: is `edgefleet control serve` running on it?"
        )
    members = require_members(spec.group, store.groups(), devices)
    mismatched = [d for d in members if spec.bundle_for(d.profile) is None]
    if mismatched:
        listed = ", ".join(f"{d.device_id} ({d.profile or 'no profile'})" for d in mismatched[:10])
        more = f" and {len(mismatched) - 10} more" if len(mismatched) > 10 else ""
        raise RolloutSpecError(
            f"{len(mismatched)} device(s) of group {spec.group!r} have a profile no bundle is built for: "
            f"{listed}{more}; the bundles are for {', '.join(sorted(b.profile for b in spec.bundles))}"
        )
    wanted = {d.device_id for d in members}
    for row in store.rollouts(ACTIVE_STATES):
        other = load_doc(row)
        busy = sorted(wanted & set(other.devices))
        if busy:
            raise RolloutSpecError(
                f"rollout {other.id} ({other.state}) still holds {len(busy)} of these devices ({', '.join(busy[:5])}); "
                "let it finish or abort it first"
            )
    rollout_id = f"{spec.group}-v{spec.bundles[0].model_version}-{secrets.token_hex(3)}"
    ordered = order_devices([d.device_id for d in members], [d.online for d in members], rollout_id)
    plan = plan_waves(ordered, spec.canary, spec.waves)
    profiles = {d.device_id: d.profile for d in members}
    doc = RolloutDoc(
        id=rollout_id,
        spec=spec,
        created_at=now,
        updated_at=now,
        waves=[WaveProgress(index=i, devices=ids) for i, ids in enumerate(plan)],
        devices={
            device_id: DeviceProgress(device_id=device_id, profile=profiles[device_id], wave=i)
            for i, ids in enumerate(plan)
            for device_id in ids
        },
    )
    doc.note(now, f"planned {len(members)} devices of {spec.group} in waves of {', '.join(str(len(w)) for w in plan)}")
    store.save_rollout(to_row(doc))
    return doc


@dataclass
class _Tick:
    now: float
    devices: dict[str, DeviceRecord]
    latest: dict[str, TelemetryPoint]
    desired_changed: bool = False


class RolloutEngine:
    def __init__(
        self, store: Store, publisher: DesiredPublisher | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store, self.publisher, self.clock = store, publisher, clock

    def tick(self) -> list[RolloutDoc]:
        """Step every active rollout once; returns them as saved."""
        rows = self.store.rollouts(ACTIVE_STATES)
        if not rows:
            return []
        ctx = _Tick(self.clock(), {d.device_id: d for d in self.store.devices()}, self.store.latest_telemetry())
        docs = []
        for row in rows:
            doc = load_doc(row)
            command = self.store.take_command(doc.id)
            if command:
                self._command(doc, command, ctx)
            for _ in range(4):  # a few phase changes per tick, so a fast wave is not held back by the tick
                before = (doc.state, [w.state for w in doc.waves])
                self._step(doc, ctx)
                if (doc.state, [w.state for w in doc.waves]) == before:
                    break
            if ctx.desired_changed:
                self._sync()
                ctx.desired_changed = False
            if doc.model_dump_json() != row.doc:
                doc.updated_at = ctx.now
                self.store.save_rollout(to_row(doc))
            docs.append(doc)
        return docs

    def _sync(self) -> None:
        if self.publisher is not None:
            self.publisher.sync()

    # --- commands
    def _command(self, doc: RolloutDoc, command: str, ctx: _Tick) -> None:
        now = ctx.now
        if command == "pause" and doc.state in ("pending", "running"):
            doc.state, doc.paused_at = "paused", now
            doc.note(now, "paused by operator")
        elif command == "resume" and doc.state == "paused":
            held = now - (doc.paused_at or now)
            wave = doc.waves[doc.current_wave]
            wave.paused_s += held
            doc.state, doc.paused_at = ("running" if wave.state != "pending" else "pending"), None
            doc.note(now, f"resumed by operator after {held:.0f} s")
        elif command == "abort" and doc.active and doc.state != "rolling-back":
            doc.outcome = "aborted by operator"
            doc.note(now, "aborted by operator")
            wave = doc.waves[doc.current_wave]
            if wave.state not in ("passed", "failed"):
                wave.state, wave.finished_at = "aborted", now
            self._start_rollback(doc, ctx, "aborted")
        else:
            doc.note(now, f"{command} ignored: the rollout is {doc.state}")

    # --- stepping
    def _step(self, doc: RolloutDoc, ctx: _Tick) -> None:
        if doc.state == "pending":
            doc.state = "running"
            doc.note(ctx.now, f"started: {len(doc.devices)} devices, {len(doc.waves)} waves")
            self._start_wave(doc, 0, ctx)
        elif doc.state == "running":
            wave = doc.waves[doc.current_wave]
            if wave.state == "baseline":
                self._baseline(doc, wave, ctx)
            elif wave.state == "deploying":
                self._deploying(doc, wave, ctx)
            elif wave.state == "observing":
                self._observing(doc, wave, ctx)
        elif doc.state == "rolling-back":
            self._rolling_back(doc, ctx)

    def _start_wave(self, doc: RolloutDoc, index: int, ctx: _Tick) -> None:
        doc.current_wave = index
        wave = doc.waves[index]
        wave.state, wave.started_at, wave.phase_started_at, wave.paused_s = "baseline", ctx.now, ctx.now, 0.0
        for device_id in wave.devices:
            progress = doc.devices[device_id]
            record = ctx.devices.get(device_id)
            bundle = doc.spec.bundle_for(record.profile if record else progress.profile)
            if record is None or bundle is None:
                progress.state = "failed"
                progress.reason = f"profile is now {record.profile if record else '?'}; no bundle in this rollout fits"
                continue
            progress.profile = record.profile
            progress.target_bundle = bundle.bundle_id
            progress.previous_bundle, progress.previous_model = record.active_bundle, record.active_model
            if record.active_bundle == bundle.bundle_id and record.verified:
                progress.state, progress.installed_at = "installed", record.status_ts
                progress.deployed_at = ctx.now
                progress.reason = "already ran the bundle"
            else:
                progress.state = "baseline"
        doc.note(ctx.now, f"wave {index}: measuring the baseline of {len(wave.devices)} device(s)")

    def _elapsed(self, wave: WaveProgress, ctx: _Tick) -> float:
        return ctx.now - (wave.phase_started_at or ctx.now) - wave.paused_s

    def _baseline(self, doc: RolloutDoc, wave: WaveProgress, ctx: _Tick) -> None:
        timing = doc.spec.timing
        waiting = [doc.devices[d] for d in wave.devices if doc.devices[d].state == "baseline"]
        ready = True
        for progress in waiting:
            if progress.previous_bundle is None or timing.baseline_s <= 0:
                continue
            latest = ctx.latest.get(progress.device_id)
            anchor = max(latest.ts if latest else 0.0, ctx.now)
            since = anchor - timing.baseline_s
            points = self.store.telemetry(progress.device_id, since - 1, bundle_id=progress.previous_bundle)
            progress.baseline = summarize(
                points, bundle_id=progress.previous_bundle, since=since, fresh_since=None,
                min_fresh_share=doc.spec.thresholds.min_fresh_share,
            )  # fmt: skip
            ready = ready and progress.baseline.reports >= timing.min_reports
        if not ready and self._elapsed(wave, ctx) < timing.baseline_s:
            return
        for progress in waiting:
            bundle = doc.spec.bundle_for(progress.profile)
            assert bundle is not None and progress.profile is not None
            self.store.put_deployment(
                Deployment(
                    scope="device", target=progress.device_id, profile=progress.profile, bundle_id=bundle.bundle_id,
                    model_name=bundle.model_name, model_version=bundle.model_version, source=f"rollout:{doc.id}",
                    updated_at=ctx.now,
                )
            )  # fmt: skip
            progress.state, progress.deployed_at = "deploying", ctx.now
        ctx.desired_changed = ctx.desired_changed or bool(waiting)
        wave.state, wave.phase_started_at, wave.paused_s = "deploying", ctx.now, 0.0
        doc.note(ctx.now, f"wave {wave.index}: deploying to {len(waiting)} device(s)")

    def _failing_events(self, wave: WaveProgress, doc: RolloutDoc) -> dict[str, EventRecord]:
        """The first refusal or rollback each device of the wave reported for its target since deployment."""
        deployed = [doc.devices[d].deployed_at for d in wave.devices if doc.devices[d].deployed_at is not None]
        if not deployed:
            return {}
        since = min(t for t in deployed if t is not None) - 1.0
        found: dict[str, EventRecord] = {}
        for event in self.store.events(received_since=since, limit=100_000):
            progress = doc.devices.get(event.device_id)
            if (
                progress is not None
                and progress.wave == wave.index
                and event.kind in FAILING_EVENTS
                and event.bundle_id == progress.target_bundle
                and event.device_id not in found
            ):
                found[event.device_id] = event
        return found

    def _commit_ts(self, device_id: str, bundle_id: str, since: float) -> float | None:
        for event in self.store.events(device_id=device_id, bundle_id=bundle_id, received_since=since):
            if event.kind == "committed":
                return event.ts
        return None

    def _deploying(self, doc: RolloutDoc, wave: WaveProgress, ctx: _Tick) -> None:
        timeout = doc.spec.timing.install_timeout_s
        failing = self._failing_events(wave, doc)
        for device_id in wave.devices:
            progress = doc.devices[device_id]
            if progress.state != "deploying":
                continue
            record = ctx.devices.get(device_id)
            event = failing.get(device_id)
            if event is not None:
                progress.state, progress.reason = "failed", f"{event.kind}: {event.detail}"
            elif record and record.online and record.active_bundle == progress.target_bundle and record.verified:
                assert progress.target_bundle is not None
                committed = self._commit_ts(device_id, progress.target_bundle, (progress.deployed_at or 0) - 1)
                progress.state, progress.installed_at = "installed", committed or record.status_ts
            elif ctx.now - (progress.deployed_at or ctx.now) - wave.paused_s > timeout:
                state = f"{record.state}, {'online' if record.online else 'offline'}" if record else "never seen"
                progress.state = "timed-out"
                progress.reason = f"did not commit {progress.target_bundle} within {timeout:g} s (device: {state})"
        if self._too_many_failures(doc, wave, ctx):
            return
        if not any(doc.devices[d].state == "deploying" for d in wave.devices):
            wave.state, wave.phase_started_at, wave.paused_s = "observing", ctx.now, 0.0
            doc.note(ctx.now, f"wave {wave.index}: installed; observing for {doc.spec.timing.observe_s:g} s")

    def _observing(self, doc: RolloutDoc, wave: WaveProgress, ctx: _Tick) -> None:
        spec = doc.spec
        elapsed = self._elapsed(wave, ctx)
        failing = self._failing_events(wave, doc)
        for device_id in wave.devices:
            progress = doc.devices[device_id]
            if progress.state != "installed":
                continue
            record = ctx.devices.get(device_id)
            event = failing.get(device_id)
            if event is not None:
                progress.state, progress.reason = "failed", f"{event.kind}: {event.detail}"
                continue
            if record is not None and record.online and record.active_bundle != progress.target_bundle:
                progress.state, progress.reason = "failed", f"left the bundle: now runs {record.active_bundle}"
                continue
            installed = progress.installed_at or 0.0
            points = self.store.telemetry(device_id, installed - 1, bundle_id=progress.target_bundle)
            observed = summarize(
                points, bundle_id=progress.target_bundle, since=installed, fresh_since=installed,
                min_fresh_share=spec.thresholds.min_fresh_share,
            )  # fmt: skip
            findings = judge_device(progress.baseline, observed, spec.thresholds)
            progress.observed, progress.findings = observed, findings
            bad = breached(findings)
            if bad:
                progress.state, progress.reason = "failed", "; ".join(f.detail for f in bad)
            elif elapsed >= spec.timing.observe_s and observed.reports >= spec.timing.min_reports:
                if not pending(findings) or elapsed >= spec.timing.observe_s + spec.timing.report_timeout_s:
                    progress.state = "passed"
                    progress.reason = "; ".join(f.detail for f in findings) or "installed and validated"
            elif elapsed >= spec.timing.observe_s + spec.timing.report_timeout_s:
                progress.state = "timed-out"
                progress.reason = (
                    f"{observed.reports} telemetry report(s) on {progress.target_bundle} after "
                    f"{elapsed:.0f} s; {spec.timing.min_reports} needed"
                )
        if self._too_many_failures(doc, wave, ctx):
            return
        if not any(doc.devices[d].state == "installed" for d in wave.devices):
            wave.state, wave.finished_at = "passed", ctx.now
            failed = [d for d in wave.devices if doc.devices[d].state in ("failed", "timed-out")]
            wave.verdict = f"passed ({len(wave.devices) - len(failed)}/{len(wave.devices)} devices)"
            doc.note(ctx.now, f"wave {wave.index}: {wave.verdict}")
            if wave.index + 1 < len(doc.waves):
                self._start_wave(doc, wave.index + 1, ctx)
            else:
                self._succeed(doc, ctx)

    def _too_many_failures(self, doc: RolloutDoc, wave: WaveProgress, ctx: _Tick) -> bool:
        failed = [doc.devices[d] for d in wave.devices if doc.devices[d].state in ("failed", "timed-out")]
        if len(failed) <= doc.spec.max_failed_devices:
            return False
        first = failed[0]
        reason = f"{first.device_id} {first.state}: {first.reason}"
        if len(failed) > 1:
            reason += f" (and {len(failed) - 1} more)"
        wave.state, wave.verdict, wave.finished_at = "failed", reason, ctx.now
        doc.outcome = f"wave {wave.index} failed: {reason}"
        doc.note(ctx.now, f"wave {wave.index} failed, rolling back: {reason}")
        self._start_rollback(doc, ctx, "rolled-back")
        return True

    # --- endings
    def _succeed(self, doc: RolloutDoc, ctx: _Tick) -> None:
        source = f"rollout:{doc.id}"
        for bundle in doc.spec.bundles:
            self.store.put_deployment(
                Deployment(
                    scope="group", target=doc.spec.group, profile=bundle.profile, bundle_id=bundle.bundle_id,
                    model_name=bundle.model_name, model_version=bundle.model_version, source=source,
                    updated_at=ctx.now,
                )
            )  # fmt: skip
        pins = [d for d in self.store.deployments() if d.scope == "device" and d.source == source]
        for pin in pins:
            self.store.delete_deployment("device", pin.target, pin.profile)
        plan = plan_desired(self.store)
        for pin in pins:  # keep a pin where another (higher-priority) group would now win
            resolved = plan.get(pin.target)
            if resolved is None or resolved.bundle_id != pin.bundle_id:
                self.store.put_deployment(pin)
        ctx.desired_changed = True
        doc.state, doc.finished_at = "succeeded", ctx.now
        doc.outcome = f"all {len(doc.waves)} waves passed; {doc.spec.group} now runs the new bundles"
        doc.note(ctx.now, doc.outcome)

    def _start_rollback(self, doc: RolloutDoc, ctx: _Tick, ends_as: RolloutState) -> None:
        now = ctx.now
        doc.state, doc.ends_as = "rolling-back", ends_as
        changed = False
        for progress in doc.devices.values():
            if progress.deployed_at is None or progress.profile is None:
                continue  # never touched
            if progress.previous_bundle == progress.target_bundle:
                continue
            if progress.previous_bundle is None:
                self.store.delete_deployment("device", progress.device_id, progress.profile)
                progress.state = "kept"
                progress.reason = (progress.reason + "; " if progress.reason else "") + (
                    "ran no bundle before the rollout, so there is nothing to return to"
                )
                changed = True
                continue
            name, _, version = (progress.previous_model or "").rpartition("@")
            known = self.store.bundle(progress.previous_bundle)
            if known is not None:
                name, version = known.model_name, known.model_version
            self.store.put_deployment(
                Deployment(
                    scope="device", target=progress.device_id, profile=progress.profile,
                    bundle_id=progress.previous_bundle, model_name=name or "unknown", model_version=version or "0",
                    rollback=True, source=f"rollback:{doc.id}", updated_at=now,
                )
            )  # fmt: skip
            if progress.state not in ("failed", "timed-out"):
                progress.reason = ""
            progress.state, progress.rollback_at = "rolling-back", now
            changed = True
        ctx.desired_changed = ctx.desired_changed or changed
        if not any(p.state == "rolling-back" for p in doc.devices.values()):
            doc.state, doc.finished_at = ends_as, now

    def _rolling_back(self, doc: RolloutDoc, ctx: _Tick) -> None:
        timeout = doc.spec.timing.install_timeout_s
        for progress in doc.devices.values():
            if progress.state != "rolling-back":
                continue
            record = ctx.devices.get(progress.device_id)
            if record is not None and record.active_bundle == progress.previous_bundle and record.online:
                progress.state = "rolled-back"
            elif ctx.now - (progress.rollback_at or ctx.now) > timeout:
                progress.state = "rollback-timed-out"
                progress.reason = f"still not back on {progress.previous_bundle} after {timeout:g} s"
        if not any(p.state == "rolling-back" for p in doc.devices.values()):
            doc.state, doc.finished_at = doc.ends_as or "rolled-back", ctx.now
            counts = doc.counts()
            doc.note(
                ctx.now,
                f"{doc.state}: {counts.get('rolled-back', 0)} device(s) back on their previous bundle, "
                f"{counts.get('rollback-timed-out', 0)} timed out, {counts.get('kept', 0)} kept",
            )


def request(store: Store, rollout_id: str, command: str) -> RolloutDoc:
    """Queue pause/resume/abort for the engine; the rollout as it stands now."""
    row = store.rollout(rollout_id)
    if row is None:
        from edgefleet.core.errors import UnknownNameError

        raise UnknownNameError("rollout", rollout_id, [r.id for r in store.rollouts()])
    doc = load_doc(row)
    if not doc.active:
        raise RolloutSpecError(f"rollout {rollout_id} has ended ({doc.state}); nothing to {command}")
    store.set_command(rollout_id, command)
    return doc


__all__ = ["ENGINE_LEASE", "RolloutEngine", "bundle_ref", "load_doc", "make_spec", "prepare_rollout", "request"]
