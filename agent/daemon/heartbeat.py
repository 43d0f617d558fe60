"""Every telemetry interval: the freeze check (an expired desired document, reported once per change) and the
telemetry message, gathered from every part that measures something.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edgefleet.agent.api import InferenceService, MqttInference
from edgefleet.agent.install import DesiredState, ServingState
from edgefleet.agent.quality import Quality
from edgefleet.agent.telemetry import Reporter, RequestStats, ResourceSampler, SpoolFigures
from edgefleet.agent.transfer import LinkPacer
from edgefleet.core.messages import Telemetry

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        interval_s: float,
        reporter: Reporter,
        serving: ServingState,
        desired: DesiredState,
        stats: RequestStats,
        resources: ResourceSampler,
        quality: Quality,
        link: LinkPacer,
        mqtt: MqttInference,
        service: Callable[[], InferenceService | None],
    ) -> None:
        self.interval_s, self.reporter, self.serving, self.desired = interval_s, reporter, serving, desired
        self.stats, self.resources, self.quality, self.link = stats, resources, quality, link
        self.mqtt, self.service = mqtt, service
        self._stale: str | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.check_stale()
                self.reporter.telemetry(self.telemetry)
            except Exception:  # telemetry must never take the agent down
                log.exception("telemetry failed")

    def check_stale(self) -> None:
        """Freeze detection: report (once per change) when the desired document in force expired."""
        stale = self.desired.stale()
        if stale != self._stale:
            self._stale = stale
            if stale:
                log.warning("%s", stale)
                self.reporter.event("desired-stale", stale)
            self.serving.publish_status()

    def telemetry(self, spool: SpoolFigures) -> Telemetry:
        latency, requests, errors, window_s = self.stats.snapshot()
        model, service = self.serving.model, self.service()
        golden = model.last_golden if model else None
        generative = model is not None and model.generative is not None
        cpu = self.resources.cpu_percent()
        streaming = generative and model is not None and bool(model.generative.active)  # type: ignore[union-attr]
        idle = requests == 0 and errors == 0 and not streaming  # no client request in the window
        return Telemetry(
            device_id=self.serving.identity.device_id,
            bundle_id=model.bundle_id if model else None,
            provider=model.provider if model else None,
            window_s=round(window_s, 3),
            requests=requests,
            errors=errors,
            throughput_rps=round(requests / window_s, 3) if window_s > 0 else 0.0,
            latency=latency,
            golden_agreement=golden.agreement if golden else None,
            golden_max_abs_error=golden.max_abs_error if golden and not generative else None,
            cpu_percent=cpu,
            idle_cpu_percent=cpu if idle else None,
            rss_mb=self.resources.rss_mb(),
            temperature_c=self.resources.temperature_c(),
            queue_depth=self.mqtt.queue_depth() + (service.metrics.queue_depth() if service else 0),
            errors_by_kind=self._errors_by_kind(service),
            spool_depth=spool.depth,
            spool_dropped=spool.dropped,
            seq=spool.seq,
            link=self.link.report(),
            generation=self.stats.generation.snapshot() if generative or self.stats.generation.seen else None,
            **self.quality.telemetry_fields(model),
        )

    def _errors_by_kind(self, service: InferenceService | None) -> dict[str, int]:
        """The local API's refusals and failures by kind, and MQTT inference's refusals ("mqtt:" kinds)."""
        found = {k[0]: int(v) for k, v in service.metrics.errors.items()} if service else {}
        return found | self.stats.refused_by_kind()


__all__ = ["Heartbeat"]
