"""Health after commit: re-check one slot's serving bundle's files, golden set and failure ratio on a timer (each slot
has its own monitor, with its own request statistics).

The verdict itself is a pure function (agent/install/health.py). An unhealthy verdict is reported at once (a
"health-failed" event) and handed to the install worker as an `Unhealthy` command: the worker, the one writer of
what the device serves, rolls back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.agent.install.commands import Command, Unhealthy
from edgefleet.agent.install.health import judge_health
from edgefleet.agent.install.serving import SlotServing
from edgefleet.agent.install.signed_files import check_bundle_files
from edgefleet.agent.telemetry import RequestStats, SlotReporter
from edgefleet.core.bundle.archive import verify_files
from edgefleet.core.errors import BundleError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthPolicy:
    interval_s: float
    max_failure_ratio: float
    failure_window: int


class HealthMonitor:
    def __init__(
        self,
        serving: SlotServing,
        stats: RequestStats,
        reporter: SlotReporter,
        send: Callable[[Command], None],
        policy: HealthPolicy,
        generation_stats: RequestStats | None = None,
    ) -> None:
        """`stats`: the slot's requests; `generation_stats`: the generations' (every path's), which a generative
        model's failure ratio is judged on."""
        self.serving, self.stats, self.reporter, self.send, self.policy = serving, stats, reporter, send, policy
        self.generation_stats = generation_stats

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.policy.interval_s):
            try:
                self.check()
            except Exception:  # health checks must never take the agent down
                log.exception("health check failed")

    def check(self) -> None:
        model = self.serving.model
        if model is None:
            return
        try:
            verify_files(model.bundle_dir, model.manifest)
            check_bundle_files(model.bundle_dir, model.manifest)
            files_ok, files_reason = True, ""
        except BundleError as err:
            files_ok, files_reason = False, str(err)
        golden = model.check_golden(warmup=0)
        stats = self.generation_stats if model.generative is not None and self.generation_stats else self.stats
        ratio, seen = stats.failure_ratio(self.policy.failure_window)
        verdict = judge_health(
            files_ok=files_ok,
            files_reason=files_reason,
            golden=golden,
            failure_ratio=ratio,
            requests_seen=seen,
            max_failure_ratio=self.policy.max_failure_ratio,
            min_requests=self.policy.failure_window,
        )
        if not verdict.healthy:
            self.reporter.event("health-failed", verdict.reason, bundle_id=model.bundle_id)
            self.send(Unhealthy(model.bundle_id, verdict.reason))


__all__ = ["HealthMonitor", "HealthPolicy"]
