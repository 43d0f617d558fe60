"""Health after commit: re-check the serving bundle's files, golden set and failure ratio; roll back locally.

A mixin of `Agent` (agent/daemon.py); the verdict itself is a pure function in agent/health.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from edgefleet.agent.health import HealthVerdict, judge_health
from edgefleet.agent.installer import load_installed
from edgefleet.agent.reporting import Reporter
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions
from edgefleet.agent.store import Store
from edgefleet.agent.trust import DeviceTrust
from edgefleet.core.bundle import verify_files
from edgefleet.core.errors import BundleError, EdgefleetError

log = logging.getLogger(__name__)


class HealthWatch(Reporter):
    store: Store
    trust: DeviceTrust
    runtime: RuntimeOptions

    if TYPE_CHECKING:

        def _swap(self, model: LoadedModel) -> LoadedModel | None: ...

    def _health_loop(self) -> None:
        while not self._stop.wait(self.config.health_interval_s):
            try:
                self._check_health()
            except Exception:  # health checks must never take the agent down
                log.exception("health check failed")

    def _check_health(self) -> None:
        model = self.model
        if model is None:
            return
        try:
            verify_files(model.bundle_dir, model.manifest)
            files_ok, files_reason = True, ""
        except BundleError as err:
            files_ok, files_reason = False, str(err)
        golden = model.check_golden(warmup=0)
        ratio, seen = self.stats.failure_ratio(self.config.failure_window)
        verdict = judge_health(
            files_ok=files_ok,
            files_reason=files_reason,
            golden=golden,
            failure_ratio=ratio,
            requests_seen=seen,
            max_failure_ratio=self.config.max_failure_ratio,
            min_requests=self.config.failure_window,
        )
        if not verdict.healthy:
            self._on_unhealthy(model, verdict)

    def _on_unhealthy(self, model: LoadedModel, verdict: HealthVerdict) -> None:
        bundle_id = model.bundle_id
        self._event("health-failed", verdict.reason, bundle_id=bundle_id)
        self.last_error = f"{bundle_id}: {verdict.reason}"
        if not self.config.rollback_on_failure:
            self._publish_status()
            return
        state = self.store.load_state()
        for previous in state.history:
            try:
                restored = load_installed(self.store, previous, self.trust, self.runtime)
            except EdgefleetError as err:
                log.warning("previous bundle %s is not usable either: %s", previous, err)
                continue
            desired = self.desired.effective()
            if desired is not None and desired.bundle_id == bundle_id:
                self.store.remember_refusal(f"{desired.bundle_id}@{desired.issued_at}")
            manifest = restored.manifest  # a local rollback is the device's own decision: the floor stays
            self.store.commit(previous, manifest.model_name, manifest.model_version, raise_floor=False)
            self._swap(restored)
            self._event("rolled-back", f"{verdict.reason}; now serving {previous}", bundle_id=bundle_id)
            self._publish_status()
            return
        log.error("bundle %s is unhealthy and there is nothing to roll back to", bundle_id)
        self._publish_status()
