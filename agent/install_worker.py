"""The install worker's side of the agent: start-up restore, signed desired state in, reconcile, refuse, retry.

A mixin of `Agent` (agent/daemon.py), which owns the threads and MQTT wiring; status and events are in
agent/reporting.py. This file holds the install decisions. Every state change goes through `Store` (one lock).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from edgefleet.agent.commit_notice import announce_commits
from edgefleet.agent.desired_state import DesiredRefused
from edgefleet.agent.installer import InstallContext, Refused, install, load_installed
from edgefleet.agent.reporting import Reporter
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions
from edgefleet.agent.store import CommitNotice, Store
from edgefleet.agent.transfer import TransferError
from edgefleet.agent.trust import DeviceTrust
from edgefleet.core.errors import BrokerError, BundleError, EdgefleetError
from edgefleet.core.messages import EventKind

log = logging.getLogger(__name__)


class InstallWorker(Reporter):
    store: Store
    trust: DeviceTrust
    runtime: RuntimeOptions
    _work: queue.Queue[str]

    if TYPE_CHECKING:

        def _swap(self, model: LoadedModel) -> LoadedModel | None: ...

    def _restore(self) -> None:
        """Start on the last committed bundle, falling back to older ones if it no longer checks out."""
        state = self.store.load_state()
        for bundle_id in [b for b in [state.committed, *state.history] if b]:
            try:
                self.model = load_installed(self.store, bundle_id, self.trust, self.runtime)
            except EdgefleetError as err:
                log.error("installed bundle %s does not check out: %s", bundle_id, err)
                self.last_error = f"{bundle_id}: {err}"
                continue
            if bundle_id != state.committed:  # a fallback is the device's own decision: the floor stays
                manifest = self.model.manifest
                self.store.commit(bundle_id, manifest.model_name, manifest.model_version, raise_floor=False)
            log.info("serving committed bundle %s on %s", bundle_id, self.model.provider)
            self.state = "serving"
            break
        else:
            self.state = "idle"
        self._announce_commits()  # a crash may have come between a commit and its event

    def _on_desired(self, topic: str, payload: bytes, group: str | None) -> None:
        """Signed desired state (agent/desired_state.py): a refused document is reported and never acted on."""
        try:
            self.desired.on_message("group" if group else "device", group, payload)
        except DesiredRefused as err:
            self._refuse_message(topic, err)
            return
        self.link.apply_desired(self.desired.effective())
        self._work.put("reconcile")

    def _refuse_message(self, topic: str, err: Exception) -> None:
        log.warning("refused message on %s: %s", topic, err)
        self._event("refused", f"message on {topic}: {err}")

    def _install_loop(self) -> None:
        while not self._stop.is_set():
            item = self._work.get()
            if item == "stop":
                return
            try:
                self._reconcile()
                self._reconcile_shadow()
            except Exception as err:  # the daemon must outlive any bug in one install
                log.exception("install worker failed")
                self.last_error = f"internal error: {err}"
                self._publish_status()

    def _reconcile(self) -> None:
        desired = self.desired.effective()
        if desired is None or (self.model is not None and desired.bundle_id == self.model.bundle_id):
            return
        key = f"{desired.bundle_id}@{desired.issued_at}"
        if key in self.store.load_state().refused:
            return
        bundle_id = desired.bundle_id
        self._event("desired", f"{desired.model_name} {desired.model_version} ({bundle_id})", bundle_id=bundle_id)
        self._set_state("downloading")
        ctx = self._install_context()

        def notify(kind: str, detail: str, progress: float | None) -> None:
            if kind == "downloaded":
                self._set_state("installing")
            self._event(kind, detail, bundle_id=bundle_id, progress=progress)  # type: ignore[arg-type]

        try:
            model = install(ctx, desired, self.store.load_state().versions, notify)
        except (TransferError, BrokerError) as err:
            # Transient: the bundle may appear, the link or disk space come back; try again later (scheduled
            # first: with a full disk even the report of this error may fail).
            self._retry_later()
            self._fail(bundle_id, "error", f"{err}; retrying in {self.config.retry_delay_s:g} s")
            return
        except (Refused, BundleError) as err:
            self.store.remember_refusal(key)
            kind: EventKind = "rolled-back" if self.model is not None else "refused"
            self._fail(bundle_id, kind, str(err))
            return
        previous = self.model
        detail = f"now serving on {model.provider}" + (f" (was {previous.bundle_id})" if previous else "")
        notice = CommitNotice(bundle_id=bundle_id, detail=detail, ts=time.time())  # owed in the commit's own write
        self.store.commit(bundle_id, model.manifest.model_name, model.manifest.model_version, notice=notice)
        model.bundle_dir = self.store.bundle_dir(bundle_id)
        self._swap(model)
        self.last_error = None
        self._set_state("serving")
        self._announce_commits()

    def _announce_commits(self) -> None:
        """Spool the "committed" events owed (agent/commit_notice.py)."""
        announce_commits(self.store, lambda n: self._event("committed", n.detail, bundle_id=n.bundle_id, ts=n.ts))

    def _install_context(self) -> InstallContext:
        return InstallContext(
            self.conn,
            self.topics,
            self.store,
            self.trust,
            self.profile.name,
            self.runtime,
            self.config.block_window,
            self.config.offer_timeout_s,
            self.config.min_free_bytes,
            int(self.profile.size_limit_mb * 1e6),
            tuple(p.name for p in self.profiles),
            self.link,
        )

    def _reconcile_shadow(self) -> None:
        """The shadow bundle the desired state names: installed through the verified path, never committed."""
        problem = self.quality.reconcile_shadow(self.desired.effective(), self.model, self._install_shadow)
        if problem is not None:
            self._event("error", problem.detail, bundle_id=problem.bundle_id)
            if problem.transient:
                self._retry_later()

    def _install_shadow(self, bundle_id: str) -> LoadedModel:
        """The signed desired document names `bundle_id` as its shadow: same signed-offer checks, no version
        floor (a shadow is never committed)."""
        desired = self.desired.effective()
        if desired is None or desired.shadow_bundle_id != bundle_id:
            raise Refused(f"shadow bundle {bundle_id} is not named by the signed desired state in force")
        shadow = desired.model_copy(update={"bundle_id": bundle_id, "shadow_bundle_id": None})

        def notify(kind: str, detail: str, progress: float | None) -> None:
            log.info("shadow %s: %s %s", bundle_id, kind, detail)

        return install(self._install_context(), shadow, self.store.load_state().versions, notify, shadow=True)

    def _fail(self, bundle_id: str, kind: EventKind, reason: str) -> None:
        log.warning("bundle %s: %s", bundle_id, reason)
        self.last_error = f"{bundle_id}: {reason}"
        self._event(kind, reason, bundle_id=bundle_id)
        self._set_state("serving" if self.model is not None else "idle")

    def _retry_later(self) -> None:
        timer = threading.Timer(self.config.retry_delay_s, self._work.put, args=("reconcile",))
        timer.daemon = True
        timer.start()
