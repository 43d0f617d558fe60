"""A slot's install worker: start-up restore, the slot's signed desired state, reconcile, admit, refuse, retry,
roll back, remove.

Each slot (edgefleet/core/topics.py) has one `Installer` with its own thread (`run`): it handles typed commands
(agent/install/commands.py) one at a time, and it alone changes what its slot serves (agent/install/serving.py):
installs, commits, local rollbacks, a signed removal. Another slot's install, failure or rollback never touches this
slot's model. Every change on disk goes through the slot's `Store` view (one lock for the state directory). Memory
is admitted across slots by one `MemoryBudget` (agent/install/admission.py) before any block is fetched. The
supervisor (agent/daemon/supervisor.py, agent/daemon/slots.py) owns the threads and the MQTT wiring.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from edgefleet.agent.install.admission import MemoryBudget, OverBudget
from edgefleet.agent.install.commands import Command, Reconcile, Repartition, Stop, Unhealthy
from edgefleet.agent.install.commit_notice import announce_commits
from edgefleet.agent.install.desired import DesiredState
from edgefleet.agent.install.installer import InstallContext, Refused, fetch_candidate, install, load_installed
from edgefleet.agent.install.serving import SlotServing
from edgefleet.agent.install.store import CommitNotice, Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.agent.quality import Quality
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.telemetry import SlotReporter
from edgefleet.agent.transfer import LinkPacer, TransferError
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BrokerError, BundleError, EdgefleetError
from edgefleet.core.messages import EventKind

log = logging.getLogger(__name__)


class Installer:
    def __init__(
        self,
        *,
        context: InstallContext,
        desired: DesiredState,
        serving: SlotServing,
        reporter: SlotReporter,
        quality: Quality,
        link: LinkPacer,
        retry_delay_s: float,
        rollback_on_failure: bool,
        budget: MemoryBudget | None = None,
    ) -> None:
        """`context.store` is the slot's view of the state directory; `serving` and `reporter` the slot's."""
        self.context, self.desired, self.serving = context, desired, serving
        self.reporter, self.quality, self.link = reporter, quality, link
        self.retry_delay_s, self.rollback_on_failure = retry_delay_s, rollback_on_failure
        self.budget = budget
        self.slot = serving.slot
        self._loaded_mb: float | None = None
        self._over_budget: tuple[str, int] | None = None  # (desired key, budget changes) of the last memory refusal
        self._commands: queue.Queue[Command] = queue.Queue()

    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def trust(self) -> DeviceTrust:
        return self.context.trust

    def put(self, command: Command) -> None:
        """Any thread: ask the worker to do something; it is done in order, on the worker's thread."""
        self._commands.put(command)

    # --- start-up (before the worker threads run)
    def restore(self) -> None:
        """Start on the last committed bundle, falling back to older ones if it no longer checks out."""
        state = self.store.load_state()
        failed: list[str] = []
        for bundle_id in [b for b in [state.committed, *state.history] if b]:
            try:
                model = self._measured(load_installed, self.store, bundle_id, self.trust, self.context.runtime)
            except EdgefleetError as err:
                log.error("installed bundle %s does not check out: %s", bundle_id, err)
                self.serving.set_error(f"{bundle_id}: {err}", publish=False)
                failed.append(f"{bundle_id}: {err}")
                continue
            if bundle_id != state.committed:  # a fallback is the device's own decision: the floor stays
                manifest = model.manifest
                self.store.commit(bundle_id, manifest.model_name, manifest.model_version, raise_floor=False)
                why = "; ".join(failed)
                reason = f"the committed bundle does not check out at start-up ({why}); now serving {bundle_id}"
                self.reporter.event("rolled-back", reason, bundle_id=state.committed)
            self._hold(model)
            self.serving.serve(model)
            log.info("slot %s: serving committed bundle %s on %s", self.slot, bundle_id, model.provider)
            self.serving.set_state("serving")
            break
        else:
            self.serving.set_state("idle")
        self._announce_commits()  # a crash may have come between a commit and its event

    # --- the worker thread
    def run(self) -> None:
        """Handle commands until `Stop`."""
        while True:
            command = self._commands.get()
            if isinstance(command, Stop):
                return
            try:
                if isinstance(command, Reconcile):
                    self._reconcile()
                    self._reconcile_shadow()
                elif isinstance(command, Repartition):
                    self._repartition(command)
                else:
                    self._on_unhealthy(command)
            except Exception as err:  # the daemon must outlive any bug in one install
                log.exception("install worker failed")
                self.serving.set_error(f"internal error: {err}")

    def _reconcile(self) -> None:
        desired = self.desired.effective(self.slot)
        model = self.serving.model
        if desired is not None and desired.remove:
            self._remove(desired.counter)
            return
        if desired is None or (model is not None and desired.bundle_id == model.bundle_id):
            if desired is not None and self.serving.refused is not None:
                self.serving.set_refused(None)
            return
        key = f"{desired.bundle_id}@{desired.issued_at}"
        if key in self.store.load_state().refused:
            return
        if self._over_budget == (key, self.budget.changes if self.budget else 0):
            return  # refused for memory, and what the other slots hold has not changed since
        bundle_id = desired.bundle_id
        self.reporter.event(
            "desired", f"{desired.model_name} {desired.model_version} ({bundle_id})", bundle_id=bundle_id
        )
        self.serving.set_state("downloading")

        def notify(kind: str, detail: str, progress: float | None) -> None:
            if kind == "downloaded":
                self.serving.set_state("installing")
            self.reporter.event(kind, detail, bundle_id=bundle_id, progress=progress)  # type: ignore[arg-type]

        try:
            floor = self.store.load_state().versions
            installed = self._measured(install, self.context, desired, floor, notify, admit=self._admit)
        except OverBudget as err:
            # Not remembered as given up: it is tried again once what the other slots hold changes.
            self._release_reservation()
            self._over_budget = (key, self.budget.changes if self.budget else 0)
            self.serving.set_refused(str(err), publish=False)
            self._fail(bundle_id, "refused", str(err))
            return
        except (TransferError, BrokerError) as err:
            self._release_reservation()
            # Transient: the bundle may appear, the link or disk space come back; try again later (scheduled
            # first: with a full disk even the report of this error may fail).
            self._retry_later()
            self._fail(bundle_id, "error", f"{err}; retrying in {self.retry_delay_s:g} s")
            return
        except (Refused, BundleError) as err:
            # Refused before its commit: nothing changed on the device, whatever it serves. "rolled-back" is only
            # for going back from a bundle this device committed (health, start-up).
            self._release_reservation()
            self.store.remember_refusal(key)
            self._fail(bundle_id, "refused", str(err))
            return
        previous = self.serving.model
        detail = f"now serving on {installed.provider}" + (f" (was {previous.bundle_id})" if previous else "")
        notice = CommitNotice(bundle_id=bundle_id, detail=detail, ts=time.time())  # owed in the commit's own write
        self.store.commit(bundle_id, installed.manifest.model_name, installed.manifest.model_version, notice=notice)
        installed.bundle_dir = self.store.bundle_dir(bundle_id)
        self._hold(installed)
        self.serving.set_refused(None, publish=False)
        self.serving.serve(installed)
        self.serving.set_error(None, publish=False)
        self.serving.set_state("serving")
        self._announce_commits()

    # --- the slot's share of the cores (agent/daemon/slots.py)
    def _repartition(self, command: Repartition) -> None:
        """Load with the new thread count from now on; reload what the slot serves with it, through the hot swap
        (its requests in flight finish on the old session). A reload that fails keeps the model that serves."""
        runtime = self.context.runtime
        if command.threads == runtime.threads:  # the same share, for another reason ("3 slots share them")
            self.serving.placement_why = command.why
            return
        self.context = dataclasses.replace(self.context, runtime=dataclasses.replace(runtime, threads=command.threads))
        before = self.serving.threads
        self.serving.threads, self.serving.placement_why = command.threads, command.why
        model = self.serving.model
        if model is None:
            return
        try:
            reloaded = self._measured(load_installed, self.store, model.bundle_id, self.trust, self.context.runtime)
        except EdgefleetError as err:
            log.warning("slot %s: reload with %d threads failed, %d kept: %s", self.slot, command.threads, before, err)
            self.serving.placement_why = f"{command.why}; the reload failed ({err}), {before or 'default'} kept"
            return
        self._hold(reloaded)
        self.serving.serve(reloaded)
        self.serving.set_state("serving")  # the status shows the new placement
        log.info("slot %s: %s reloaded with %d threads (%s)", self.slot, model.bundle_id, command.threads, command.why)

    # --- memory (agent/install/admission.py)
    def _admit(self, manifest: Manifest) -> None:
        if self.budget is not None:
            self.budget.admit(self.slot, manifest)

    def _hold(self, model: LoadedModel) -> None:
        """`model` is the slot's now: its share of the budget, and the memory its load was measured to add."""
        self.serving.memory_mb = self._loaded_mb
        if self.budget is not None:
            self.budget.hold(self.slot, model.manifest)

    def _measured(self, load: Callable[..., LoadedModel], *args: Any, **kwargs: Any) -> LoadedModel:
        """Run `load`, measuring what it added to the process's resident memory (SlotStatus.memory_mb: another
        slot loading at the same moment counts too; the figure is what this device saw, not the manifest's)."""
        process = psutil.Process()
        before = process.memory_info().rss
        model = load(*args, **kwargs)
        self._loaded_mb = max(0.0, (process.memory_info().rss - before) / 1e6)
        return model

    def _release_reservation(self) -> None:
        """A failed install leaves the slot holding what it serves (or nothing)."""
        if self.budget is not None:
            model = self.serving.model
            self.budget.hold(self.slot, model.manifest if model is not None else None)

    # --- a signed removal
    def _remove(self, counter: int) -> None:
        """The slot's document in force says remove: drain and unload its model, stop its shadow, forget its
        files (its floor stays). Done once; the removal stays in force until a new document names a bundle."""
        model = self.serving.model
        if model is None and not self.store.load_state().committed:
            return
        self.quality.reconcile_shadow(None, None, self._install_shadow)
        self.serving.unload()
        if self.budget is not None:
            self.budget.hold(self.slot, None)
        forgotten = self.store.forget()
        detail = f"slot {self.slot} removed by a signed decision (counter {counter})"
        if model is not None:
            detail += f"; {model.bundle_id} drained and unloaded"
        if forgotten:
            detail += f"; files of {', '.join(forgotten)} deleted"
        self.reporter.event("removed", detail, bundle_id=model.bundle_id if model else None)
        self.serving.set_error(None, publish=False)
        self.serving.set_state("idle")

    def _announce_commits(self) -> None:
        """Spool the "committed" events owed (agent/install/commit_notice.py)."""
        announce_commits(
            self.store, lambda n: self.reporter.event("committed", n.detail, bundle_id=n.bundle_id, ts=n.ts)
        )

    def _reconcile_shadow(self) -> None:
        """The shadow bundle the desired state names: installed through the verified path, never committed."""
        desired = self.desired.effective(self.slot)
        if desired is not None and desired.remove:
            return
        problem = self.quality.reconcile_shadow(desired, self.serving.model, self._install_shadow)
        if problem is not None:
            self.reporter.event("error", problem.detail, bundle_id=problem.bundle_id)
            if problem.transient:
                self._retry_later()

    def _install_shadow(self, bundle_id: str) -> LoadedModel:
        """The signed desired document names `bundle_id` as its shadow: same signed-offer checks, no version
        floor (a shadow is never committed)."""
        desired = self.desired.effective(self.slot)
        if desired is None or desired.shadow_bundle_id != bundle_id:
            raise Refused(f"shadow bundle {bundle_id} is not named by the signed desired state in force")
        shadow = desired.model_copy(update={"bundle_id": bundle_id, "shadow_bundle_id": None})

        def notify(kind: str, detail: str, progress: float | None) -> None:
            log.info("shadow %s: %s %s", bundle_id, kind, detail)

        return install(self.context, shadow, self.store.load_state().versions, notify, shadow=True)

    def _fail(self, bundle_id: str, kind: EventKind, reason: str) -> None:
        log.warning("slot %s, bundle %s: %s", self.slot, bundle_id, reason)
        self.serving.set_error(f"{bundle_id}: {reason}", publish=False)
        self.reporter.event(kind, reason, bundle_id=bundle_id)
        self.serving.set_state("serving" if self.serving.model is not None else "idle")

    def _retry_later(self) -> None:
        timer = threading.Timer(self.retry_delay_s, self.put, args=(Reconcile(),))
        timer.daemon = True
        timer.start()

    # --- health after commit
    def _on_unhealthy(self, command: Unhealthy) -> None:
        """The health monitor's verdict on the bundle served when it judged: roll back to the newest previous
        bundle that still checks out (unless rollback is off). A verdict on a bundle no longer served is moot."""
        model = self.serving.model
        if model is None or model.bundle_id != command.bundle_id:
            log.info("health verdict on %s is moot: it is no longer served", command.bundle_id)
            return
        bundle_id = command.bundle_id
        self.serving.set_error(f"{bundle_id}: {command.reason}", publish=False)
        if not self.rollback_on_failure:
            self.serving.publish_status()
            return
        for previous in self.store.load_state().history:
            try:
                restored = self._measured(load_installed, self.store, previous, self.trust, self.context.runtime)
            except EdgefleetError as err:
                log.warning("previous bundle %s is not usable either: %s", previous, err)
                continue
            desired = self.desired.effective(self.slot)
            if desired is not None and desired.bundle_id == bundle_id:
                self.store.remember_refusal(f"{desired.bundle_id}@{desired.issued_at}")
            manifest = restored.manifest  # a local rollback is the device's own decision: the floor stays
            self.store.commit(previous, manifest.model_name, manifest.model_version, raise_floor=False)
            self._hold(restored)
            self.serving.serve(restored)
            self.reporter.event("rolled-back", f"{command.reason}; now serving {previous}", bundle_id=bundle_id)
            self.serving.publish_status()
            return
        log.error("bundle %s is unhealthy and there is nothing to roll back to", bundle_id)
        self.serving.publish_status()

    # --- the device as a benchmark farm
    def fetch_candidate(self, bundle_id: str, folder: Path) -> tuple[Path, Manifest]:
        """A benchmark-only candidate, fetched and verified like any bundle, outside the store."""
        return fetch_candidate(self.context, bundle_id, folder)


__all__ = ["Installer"]
