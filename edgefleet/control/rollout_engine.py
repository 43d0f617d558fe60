"""The rollout engine: drives every active rollout one step per tick, all state in the store.

Each wave goes baseline → deploying → observing → passed/failed:
- shadow (optional, before the first wave; `rollout_shadow`): the canary runs the candidate beside its bundle;
- baseline: the telemetry each device sent on the bundle it runs now, over the last `baseline_s`
  (waits up to `baseline_s` for `min_reports` reports, and up to `report_timeout_s` more while latency has no
  p95 over `min_requests` requests yet; a device with no bundle has no baseline);
- deploying: a device-scope deployment per device (published as its retained desired topic); a device
  is installed once its status shows the bundle active and verified (golden set passed on the device);
  a `refused`, `rolled-back` or `health-failed` event fails it, silence past `install_timeout_s` times it out;
- observing: reports sent wholly after the commit are judged against the baseline (`judge.judge_device`);
  a breach fails the device at once, a device passes after `observe_s` with `min_reports` reports and
  nothing left pending; at `observe_s + report_timeout_s` a criterion still lacking data fails the device
  ("no data for latency: …") unless the spec allows it unjudged, and a device with too few reports times out.
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
import time
from collections.abc import Callable

from edgefleet.control.desired import DesiredPublisher
from edgefleet.control.judge import breached, judge_device, pending, settle, summarize
from edgefleet.control.registry import host_view
from edgefleet.control.rollout import ACTIVE_STATES, RolloutDoc, Tick, WaveProgress
from edgefleet.control.rollout_endings import rolling_back, start_rollback, succeed
from edgefleet.control.rollout_setup import bundle_ref, load_doc, make_spec, prepare_rollout, request, to_row
from edgefleet.control.rollout_shadow import shadow_step, stop_shadow
from edgefleet.control.store import Deployment, EventRecord, Store

log = logging.getLogger(__name__)

ENGINE_LEASE = "rollout-engine"
FAILING_EVENTS = ("refused", "rolled-back", "health-failed")


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
        devices = {d.device_id: host_view(d) for d in self.store.devices()}  # profile and groups: the registry's
        ctx = Tick(self.clock(), devices, self.store.latest_telemetry())
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
    def _command(self, doc: RolloutDoc, command: str, ctx: Tick) -> None:
        now = ctx.now
        if command == "pause" and doc.state in ("pending", "running"):
            doc.state, doc.paused_at = "paused", now
            doc.note(now, "paused by operator")
        elif command == "resume" and doc.state == "paused":
            held = now - (doc.paused_at or now)
            wave = doc.waves[doc.current_wave]
            wave.paused_s += held
            shadowing = doc.shadow is not None and doc.shadow.state == "running"
            if shadowing and doc.shadow is not None:
                doc.shadow.paused_s += held
            doc.state, doc.paused_at = ("running" if wave.state != "pending" or shadowing else "pending"), None
            doc.note(now, f"resumed by operator after {held:.0f} s")
        elif command == "abort" and doc.active and doc.state != "rolling-back":
            doc.outcome = "aborted by operator"
            doc.note(now, "aborted by operator")
            wave = doc.waves[doc.current_wave]
            if wave.state not in ("passed", "failed"):
                wave.state, wave.finished_at = "aborted", now
            if doc.shadow is not None and doc.shadow.state in ("pending", "running"):
                doc.shadow.state, doc.shadow.finished_at, doc.shadow.verdict = "failed", now, "aborted by operator"
                stop_shadow(self.store, doc, ctx)
            start_rollback(self.store, doc, ctx, "aborted")
        else:
            doc.note(now, f"{command} ignored: the rollout is {doc.state}")

    # --- stepping
    def _step(self, doc: RolloutDoc, ctx: Tick) -> None:
        if doc.state == "pending":
            doc.state = "running"
            doc.note(ctx.now, f"started: {len(doc.devices)} devices, {len(doc.waves)} waves")
            if doc.shadow is None:
                self._start_wave(doc, 0, ctx)
        elif doc.state == "running" and doc.shadow is not None and doc.shadow.state in ("pending", "running"):
            outcome = shadow_step(self.store, doc, ctx)
            if outcome == "passed":
                self._start_wave(doc, 0, ctx)
            elif outcome == "failed":
                doc.state, doc.finished_at = "rolled-back", ctx.now
        elif doc.state == "running":
            wave = doc.waves[doc.current_wave]
            if wave.state == "baseline":
                self._baseline(doc, wave, ctx)
            elif wave.state == "deploying":
                self._deploying(doc, wave, ctx)
            elif wave.state == "observing":
                self._observing(doc, wave, ctx)
        elif doc.state == "rolling-back":
            rolling_back(doc, ctx)

    def _start_wave(self, doc: RolloutDoc, index: int, ctx: Tick) -> None:
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

    def _elapsed(self, wave: WaveProgress, ctx: Tick) -> float:
        return ctx.now - (wave.phase_started_at or ctx.now) - wave.paused_s

    def _baseline(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> None:
        timing = doc.spec.timing
        waiting = [doc.devices[d] for d in wave.devices if doc.devices[d].state == "baseline"]
        ready = latency_ready = True
        for progress in waiting:
            if progress.previous_bundle is None or timing.baseline_s <= 0:
                continue
            latest = ctx.latest.get(progress.device_id)
            anchor = max(latest.ts if latest else 0.0, ctx.now)
            since = anchor - timing.baseline_s
            points = self.store.telemetry(progress.device_id, since - 1, bundle_id=progress.previous_bundle)
            quality = self.store.quality(progress.device_id, since - 1, bundle_id=progress.previous_bundle)
            progress.baseline = summarize(
                points, bundle_id=progress.previous_bundle, since=since, fresh_since=None,
                min_fresh_share=doc.spec.thresholds.min_fresh_share, quality=quality,
            )  # fmt: skip
            ready = ready and progress.baseline.reports >= timing.min_reports
            t = doc.spec.thresholds
            has_latency = progress.baseline.p95_ms is not None and progress.baseline.volume >= t.min_requests
            latency_ready = latency_ready and (t.max_latency_factor is None or has_latency)
        elapsed = self._elapsed(wave, ctx)
        if not ready and elapsed < timing.baseline_s:
            return
        if not latency_ready and elapsed < timing.baseline_s + timing.report_timeout_s:
            return  # no baseline latency yet (a quiet device: its probes bring some); wait, bounded
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

    def _deploying(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> None:
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

    def _observing(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> None:
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
            quality = self.store.quality(device_id, installed - 1, bundle_id=progress.target_bundle)
            observed = summarize(
                points, bundle_id=progress.target_bundle, since=installed, fresh_since=installed,
                min_fresh_share=spec.thresholds.min_fresh_share, quality=quality,
            )  # fmt: skip
            findings = judge_device(progress.baseline, observed, spec.thresholds)
            deadline = spec.timing.observe_s + spec.timing.report_timeout_s
            if elapsed >= deadline:  # time is up: what still lacks data fails, unless allowed unjudged
                findings = settle(findings, spec.allow_unjudged)
            progress.observed, progress.findings = observed, findings
            bad = breached(findings)
            enough = observed.reports >= spec.timing.min_reports
            if bad and (enough or elapsed < deadline):
                progress.state, progress.reason = "failed", "; ".join(f.detail for f in bad)
            elif elapsed >= spec.timing.observe_s and enough and not pending(findings):
                progress.state = "passed"
                progress.reason = "; ".join(f.detail for f in findings) or "installed and validated"
            elif elapsed >= deadline:
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
                succeed(self.store, doc, ctx)

    def _too_many_failures(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> bool:
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
        start_rollback(self.store, doc, ctx, "rolled-back")
        return True


__all__ = [
    "ENGINE_LEASE",
    "RolloutEngine",
    "bundle_ref",
    "load_doc",
    "make_spec",
    "prepare_rollout",
    "request",
    "to_row",
]
