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

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.fleet.registry import host_view
from edgefleet.control.health import ENGINE, LoopHealth
from edgefleet.control.rollout import agent_waves
from edgefleet.control.rollout.commands import bundle_ref, load_doc, make_spec, prepare_rollout, request, to_row
from edgefleet.control.rollout.finish import rolling_back, start_rollback, succeed
from edgefleet.control.rollout.install_evidence import EvidenceReader, golden_reports
from edgefleet.control.rollout.judge.basis import judge_on_basis
from edgefleet.control.rollout.judge.neighbours import neighbour_breach
from edgefleet.control.rollout.judge.plausibility import judge_evidence
from edgefleet.control.rollout.judge.wave import Metrics, breached, pending, settle, summarize
from edgefleet.control.rollout.plan import ACTIVE_STATES, FAILED_STATES, DeviceProgress, RolloutDoc, Tick, WaveProgress
from edgefleet.control.rollout.shadow import shadow_step, stop_shadow
from edgefleet.control.rollout.targets import rollback_target
from edgefleet.control.store import BundleRecord, Deployment, DeviceRecord, EventRecord, FencedOut, RolloutRow, Store
from edgefleet.core.topics import check_segment
from edgefleet.core.untrusted import safe_text

log = logging.getLogger(__name__)

ENGINE_LEASE = "rollout-engine"
MAX_STEP_FAILURES = 10  # a rollout whose step fails this many ticks in a row is paused (the operator resumes it)
FAILING_EVENTS = ("refused", "rolled-back", "health-failed")


def _an_id(value: str | None) -> bool:
    """A string a device sent that has the shape of a bundle id (only then is it looked up in the store)."""
    try:
        return value is not None and bool(check_segment("bundle id", value))
    except ValueError:
        return False


NEIGHBOUR_BEFORE_S = 60.0  # at least this much of a neighbour slot's reports before the install tells where it was


class RolloutEngine:
    def __init__(
        self,
        store: Store,
        publisher: DesiredPublisher | None,
        *,
        clock: Callable[[], float] = time.time,
        health: LoopHealth | None = None,
    ) -> None:
        """`health`: the record of this engine's ticks (the control plane keeps one across lease terms)."""
        self.store, self.publisher, self.clock = store, publisher, clock
        self.health = health or LoopHealth(ENGINE, 1.0, now=clock())
        self.evidence = EvidenceReader(store)

    def tick(self) -> list[RolloutDoc]:
        """Step every active rollout once; returns them as saved. One rollout whose step raises fails that step
        (noted in its log, the engine's `errors` counted) and the others go on; a device whose step raises fails
        that device with the reason. Only a fenced-out write stops the tick: another instance leads now."""
        rows = self.store.rollouts(ACTIVE_STATES)
        if not rows:
            self.health.ticked(self.clock())
            return []
        devices = {d.device_id: host_view(d) for d in self.store.devices()}  # profile and groups: the registry's
        ctx = Tick(self.clock(), devices, self.store.latest_telemetry())
        docs = []
        for row in rows:
            try:
                doc = load_doc(row)
            except ValueError as err:  # a document this version cannot read: it cannot be stepped, the rest can
                self.health.failed(ctx.now, f"rollout {row.id}: unreadable document: {err}")
                continue
            try:
                docs.append(self._tick_one(row, doc, ctx))
            except FencedOut:
                raise
            except Exception as err:
                log.exception("rollout %s: its step failed", doc.id)
                self.health.failed(ctx.now, f"rollout {doc.id}: {err}")
                self._step_failed(row, err, ctx)
            if ctx.desired_changed:
                ctx.desired_changed = False
                try:
                    self._sync()
                except FencedOut:
                    raise
                except Exception as err:  # the periodic sync retries; the rollouts go on
                    log.exception("desired-state sync after rollout %s failed", row.id)
                    self.health.failed(ctx.now, f"desired-state sync: {err}")
        self.health.ticked(self.clock())
        return docs

    def _tick_one(self, row: RolloutRow, doc: RolloutDoc, ctx: Tick) -> RolloutDoc:
        command = self.store.take_command(doc.id)
        if command:
            self._command(doc, command, ctx)
        for _ in range(4):  # a few phase changes per tick, so a fast wave is not held back by the tick
            before = (doc.state, [w.state for w in doc.waves])
            self._step(doc, ctx)
            if (doc.state, [w.state for w in doc.waves]) == before:
                break
        doc.step_failures, doc.step_error = 0, ""
        if doc.model_dump_json() != row.doc:
            doc.updated_at = ctx.now
            self.store.save_rollout(to_row(doc))
        return doc

    def _step_failed(self, row: RolloutRow, err: Exception, ctx: Tick) -> None:
        """The rollout as it was before this step, with the failure noted; paused once it failed too often."""
        doc = load_doc(row)
        doc.step_failures += 1
        why = safe_text(f"{type(err).__name__}: {err}", 300)
        if doc.step_error != why:
            doc.note(ctx.now, f"step failed (it is retried next tick): {why}")
        doc.step_error = why
        if doc.step_failures >= MAX_STEP_FAILURES and doc.state in ("pending", "running"):
            doc.state, doc.paused_at = "paused", ctx.now
            doc.note(ctx.now, f"paused: its step failed {doc.step_failures} times in a row; resume it once fixed")
        doc.updated_at = ctx.now
        try:
            self.store.save_rollout(to_row(doc))
        except FencedOut:
            raise
        except Exception as again:
            log.error("rollout %s: cannot record its failed step: %s", doc.id, again)

    def _sync(self) -> None:
        if self.publisher is not None:
            self.publisher.sync()

    @contextlib.contextmanager
    def _device(self, progress: DeviceProgress, ctx: Tick) -> Iterator[None]:
        """One device's part of a step: what raises fails this device, with the reason, and nothing else."""
        try:
            yield
        except FencedOut:
            raise
        except Exception as err:
            log.exception("rollout step for device %s failed", progress.device_id)
            self.health.failed(ctx.now, f"device {progress.device_id}: {err}")
            progress.state = "failed"
            progress.reason = safe_text(f"the control plane could not judge it: {type(err).__name__}: {err}", 300)

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
            with self._device(progress, ctx):
                self._start_device(doc, progress, ctx)
        doc.note(ctx.now, f"wave {index}: measuring the baseline of {len(wave.devices)} device(s)")

    def _start_device(self, doc: RolloutDoc, progress: DeviceProgress, ctx: Tick) -> None:
        if doc.spec.agent_release is not None:
            agent_waves.start_device(self.store, doc, progress, ctx)
            return
        device_id = progress.device_id
        record = ctx.devices.get(device_id)
        bundle = doc.spec.bundle_for(record.profile if record else progress.profile)
        if record is None or bundle is None:
            progress.state = "failed"
            progress.reason = f"profile is now {record.profile if record else '?'}; no bundle in this rollout fits"
            return
        progress.profile = record.profile
        progress.target_bundle = bundle.bundle_id
        slot = record.slot(doc.spec.slot)  # the rolled-out slot; the device's other slots are not this rollout's
        claimed = slot.active_bundle if slot else None  # the device's word: measured on, never signed into a document
        progress.reported_bundle = claimed
        target = rollback_target(claimed, record.profile, self._published(claimed), self._committed(device_id, claimed))
        progress.previous_bundle = target.bundle.bundle_id if target.bundle else None
        progress.previous_model = f"{target.bundle.model_name}@{target.bundle.model_version}" if target.bundle else None
        progress.rollback_note = target.reason
        if claimed == bundle.bundle_id and slot and slot.verified and self._committed(device_id, claimed):
            progress.state, progress.installed_at = "installed", record.status_ts
            progress.deployed_at, progress.already_ran = ctx.now, True
            progress.reason = "already ran the bundle"
        else:
            progress.state = "baseline"

    def _published(self, bundle_id: str | None) -> BundleRecord | None:
        """The store's record of a bundle it published (None for an id it never published, or no id)."""
        if bundle_id is None or not _an_id(bundle_id):
            return None
        return self.store.bundle(bundle_id)

    def _committed(self, device_id: str, bundle_id: str | None) -> bool:
        """Whether the store holds a "committed" event from this device for this bundle."""
        if bundle_id is None or not _an_id(bundle_id):
            return False
        return any(e.kind == "committed" for e in self.store.events(device_id=device_id, bundle_id=bundle_id))

    def _elapsed(self, wave: WaveProgress, ctx: Tick) -> float:
        return ctx.now - (wave.phase_started_at or ctx.now) - wave.paused_s

    def _baseline(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> None:
        timing, t = doc.spec.timing, doc.spec.thresholds
        ready = latency_ready = True
        for progress in [doc.devices[d] for d in wave.devices if doc.devices[d].state == "baseline"]:
            with self._device(progress, ctx):
                baseline = self._measure_baseline(doc, progress, ctx)
                if baseline is None:
                    continue
                ready = ready and baseline.reports >= timing.min_reports
                has_latency = baseline.p95_ms is not None and baseline.volume >= t.min_requests
                latency_ready = latency_ready and (t.max_latency_factor is None or has_latency)
        elapsed = self._elapsed(wave, ctx)
        if not ready and elapsed < timing.baseline_s:
            return
        if not latency_ready and elapsed < timing.baseline_s + timing.report_timeout_s:
            return  # no baseline latency yet (a quiet device: its probes bring some); wait, bounded
        waiting = [doc.devices[d] for d in wave.devices if doc.devices[d].state == "baseline"]
        for progress in waiting:
            with self._device(progress, ctx):
                if doc.spec.agent_release is not None:
                    agent_waves.deploy(self.store, doc, progress, ctx)
                    continue
                bundle = doc.spec.bundle_for(progress.profile)
                if bundle is None or progress.profile is None:
                    raise ValueError(f"no bundle of this rollout fits its profile {progress.profile}")
                self.store.put_deployment(
                    Deployment(
                        scope="device", target=progress.device_id, profile=progress.profile,
                        bundle_id=bundle.bundle_id, model_name=bundle.model_name, model_version=bundle.model_version,
                        source=f"rollout:{doc.id}", updated_at=ctx.now, slot=doc.spec.slot,
                    )
                )  # fmt: skip
                progress.state, progress.deployed_at = "deploying", ctx.now
                ctx.desired_changed = True
        wave.state, wave.phase_started_at, wave.paused_s = "deploying", ctx.now, 0.0
        doc.note(ctx.now, f"wave {wave.index}: deploying to {len(waiting)} device(s)")

    def _measure_baseline(self, doc: RolloutDoc, progress: DeviceProgress, ctx: Tick) -> Metrics | None:
        """The telemetry the device sent on what it runs now, over the last `baseline_s` (None: it runs nothing)."""
        timing = doc.spec.timing
        measured_on = progress.reported_bundle  # what it runs: its reports are tagged with that
        if measured_on is None or timing.baseline_s <= 0:
            return None
        slot = doc.spec.slot
        latest = ctx.latest.get((progress.device_id, slot))
        anchor = max(latest.ts if latest else 0.0, ctx.now)
        since = anchor - timing.baseline_s
        points = self.store.telemetry(progress.device_id, since - 1, bundle_id=measured_on, slot=slot)
        quality = self.store.quality(progress.device_id, since - 1, bundle_id=measured_on, slot=slot)
        progress.baseline = summarize(
            points, bundle_id=measured_on, since=since, fresh_since=None,
            min_fresh_share=doc.spec.thresholds.min_fresh_share, quality=quality,
        )  # fmt: skip
        return progress.baseline

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
                and event.slot in (None, doc.spec.slot)
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
        failing = self._failing_events(wave, doc)
        for device_id in wave.devices:
            progress = doc.devices[device_id]
            if progress.state == "deploying":
                with self._device(progress, ctx):
                    if doc.spec.agent_release is not None:
                        agent_waves.check_install(self.store, doc, wave, progress, ctx)
                    else:
                        self._check_install(doc, wave, progress, failing.get(device_id), ctx)
        if self._too_many_failures(doc, wave, ctx):
            return
        if not any(doc.devices[d].state == "deploying" for d in wave.devices):
            wave.state, wave.phase_started_at, wave.paused_s = "observing", ctx.now, 0.0
            doc.note(ctx.now, f"wave {wave.index}: installed; observing for {doc.spec.timing.observe_s:g} s")

    def _check_install(
        self, doc: RolloutDoc, wave: WaveProgress, progress: DeviceProgress, event: EventRecord | None, ctx: Tick
    ) -> None:
        timeout = doc.spec.timing.install_timeout_s
        record = ctx.devices.get(progress.device_id)
        slot = record.slot(doc.spec.slot) if record else None
        if event is not None:
            progress.state = "refused" if event.kind == "refused" else "failed"
            progress.reason = f"{event.kind}: {safe_text(event.detail, 300)}"
        elif (
            record and record.online and slot and progress.target_bundle is not None
            and slot.active_bundle == progress.target_bundle and slot.verified
        ):  # fmt: skip
            committed = self._commit_ts(progress.device_id, progress.target_bundle, (progress.deployed_at or 0) - 1)
            progress.state, progress.installed_at = "installed", committed or record.status_ts
        elif ctx.now - (progress.deployed_at or ctx.now) - wave.paused_s > timeout:
            state = f"{record.state}, {'online' if record.online else 'offline'}" if record else "never seen"
            progress.state = "timed-out"
            progress.reason = f"did not commit {progress.target_bundle} within {timeout:g} s (device: {state})"

    def _observing(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> None:
        elapsed = self._elapsed(wave, ctx)
        failing = self._failing_events(wave, doc)
        for device_id in wave.devices:
            progress = doc.devices[device_id]
            if progress.state == "installed":
                with self._device(progress, ctx):
                    if doc.spec.agent_release is not None:
                        agent_waves.observe(self.store, doc, progress, elapsed, ctx)
                    else:
                        self._observe(doc, progress, failing.get(device_id), elapsed, ctx)
        if self._too_many_failures(doc, wave, ctx):
            return
        if not any(doc.devices[d].state == "installed" for d in wave.devices):
            wave.state, wave.finished_at = "passed", ctx.now
            failed = [d for d in wave.devices if doc.devices[d].state in FAILED_STATES]
            wave.verdict = f"passed ({len(wave.devices) - len(failed)}/{len(wave.devices)} devices)"
            doc.note(ctx.now, f"wave {wave.index}: {wave.verdict}")
            if wave.index + 1 < len(doc.waves):
                self._start_wave(doc, wave.index + 1, ctx)
            else:
                succeed(self.store, doc, ctx)

    def _observe(
        self, doc: RolloutDoc, progress: DeviceProgress, event: EventRecord | None, elapsed: float, ctx: Tick
    ) -> None:
        spec, device_id = doc.spec, progress.device_id
        record = ctx.devices.get(device_id)
        if event is not None:
            progress.state, progress.reason = "failed", f"{event.kind}: {safe_text(event.detail, 300)}"
            return
        if record is not None and record.online and record.running(spec.slot) != progress.target_bundle:
            progress.state = "failed"
            progress.reason = f"left the bundle: now runs {safe_text(record.running(spec.slot), 80)}"
            return
        installed = progress.installed_at or 0.0
        points = self.store.telemetry(device_id, installed - 1, bundle_id=progress.target_bundle, slot=spec.slot)
        quality = self.store.quality(device_id, installed - 1, bundle_id=progress.target_bundle, slot=spec.slot)
        observed = summarize(
            points, bundle_id=progress.target_bundle, since=installed, fresh_since=installed,
            min_fresh_share=spec.thresholds.min_fresh_share, quality=quality,
        )  # fmt: skip
        final = elapsed >= spec.timing.observe_s  # latency is judged slower only once the window ended
        facts = self.evidence.facts(progress.target_bundle)
        # What the device ran before: the rollback target, else the bundle its baseline was measured on (its word,
        # as the baseline itself is; the facts are the host's own record of that bundle, or none).
        claimed = progress.reported_bundle if _an_id(progress.reported_bundle) else None
        previous = self.evidence.facts(progress.previous_bundle) or self.evidence.facts(claimed)
        findings = judge_on_basis(
            progress.baseline, observed, facts, previous, progress.profile, spec.thresholds, final
        )
        evidence = self.evidence.install(progress)
        findings.append(
            judge_evidence(
                facts,
                evidence,
                observed,
                golden_reports(points, quality),
                progress.profile,
                spec.thresholds,
                final=final,
            )
        )
        deadline = spec.timing.observe_s + spec.timing.report_timeout_s
        if elapsed >= deadline:  # time is up: what still lacks data fails, unless allowed unjudged
            findings = settle(findings, spec.allow_unjudged)
        progress.observed, progress.findings = observed, findings
        bad = breached(findings)
        enough = observed.reports >= spec.timing.min_reports
        starved = self._starved_neighbour(doc, progress, record)
        if starved is not None:
            progress.state, progress.reason = "failed", starved
        elif bad and (enough or elapsed < deadline):
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

    def _starved_neighbour(self, doc: RolloutDoc, progress: DeviceProgress, record: DeviceRecord | None) -> str | None:
        """The neighbour guardrail (judge/neighbours.py): why the new bundle of this slot pushed another slot of
        the device outside its latency objective, or None."""
        if record is None or progress.installed_at is None:
            return None
        spec, installed = doc.spec, progress.installed_at
        window = max(spec.timing.baseline_s, spec.timing.observe_s, NEIGHBOUR_BEFORE_S)
        bundle = spec.bundle_for(progress.profile)
        arrived = f"{spec.slot} v{bundle.model_version}" if bundle else f"{spec.slot} {progress.target_bundle}"
        for neighbour in record.slots:
            objective = neighbour.latency_objective_ms
            if neighbour.slot == spec.slot or objective is None:
                continue
            before = self.store.telemetry(progress.device_id, installed - window, installed, slot=neighbour.slot)
            after = self.store.telemetry(progress.device_id, installed, slot=neighbour.slot)
            why = neighbour_breach(
                neighbour.slot, objective, before, after, arrived, min_reports=spec.timing.min_reports
            )
            if why is not None:
                return why
        return None

    def _too_many_failures(self, doc: RolloutDoc, wave: WaveProgress, ctx: Tick) -> bool:
        failed = [doc.devices[d] for d in wave.devices if doc.devices[d].state in FAILED_STATES]
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
