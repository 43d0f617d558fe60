"""Every telemetry interval: the freeze check (an expired desired document, reported once per change) and one
telemetry message per slot (`Telemetry.slot`), gathered from every part that measures something. A slot's figures
(requests, latency, golden, drift, shadow, probes) are its own; the device-wide ones (CPU, memory, spool, link) are
the process's and repeat in each. Requests refused before a slot was known count in the first slot's report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edgefleet.agent.api import InferenceService, MqttInference
from edgefleet.agent.daemon.slots import SlotParts, Slots
from edgefleet.agent.install import DesiredState, DeviceServing
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.schedule.gate import ComputeGate
from edgefleet.agent.telemetry import Reporter, RequestStats, ResourceSampler, SpoolFigures
from edgefleet.agent.transfer import LinkPacer
from edgefleet.core.messages import SlotTiming, Telemetry

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        interval_s: float,
        reporter: Reporter,
        serving: DeviceServing,
        slots: Slots,
        desired: DesiredState,
        refusals: RequestStats,
        generations: RequestStats,
        resources: ResourceSampler,
        link: LinkPacer,
        mqtt: MqttInference,
        service: Callable[[], InferenceService | None],
        compute: ComputeGate | None = None,
    ) -> None:
        self.interval_s, self.reporter, self.serving, self.slots, self.desired = (
            interval_s, reporter, serving, slots, desired
        )  # fmt: skip
        self.refusals, self.generations, self.resources, self.link = refusals, generations, resources, link
        self.mqtt, self.service, self.compute = mqtt, service, compute
        self._stale: str | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.check_stale()
                self.report()
            except Exception:  # telemetry must never take the agent down
                log.exception("telemetry failed")

    def report(self) -> None:
        """One telemetry message per slot; a device with no slot yet sends one for the default slot."""
        slots: list[SlotParts | None] = [p for _, p in sorted(self.slots.all().items())]
        cpu = self.resources.cpu_percent()
        for index, parts in enumerate(slots or [None]):
            self.reporter.telemetry(self._builder(parts, cpu, first=index == 0))

    def _builder(self, parts: SlotParts | None, cpu: float, *, first: bool) -> Callable[[SpoolFigures], Telemetry]:
        return lambda spool: self.telemetry(spool, parts, cpu, first=first)

    def check_stale(self) -> None:
        """Freeze detection: report (once per change) when a slot's desired document in force expired."""
        stale = self.desired.stale_any()
        if stale != self._stale:
            self._stale = stale
            if stale:
                log.warning("%s", stale)
                self.reporter.event("desired-stale", stale)
            self.serving.publish_status()

    def telemetry(
        self, spool: SpoolFigures, parts: SlotParts | None, cpu: float | None = None, *, first: bool = True
    ) -> Telemetry:
        model = parts.serving.model if parts is not None else None
        generative = model is not None and model.generative is not None
        stats = self.generations if generative or parts is None else parts.stats
        latency, requests, errors, window_s = stats.snapshot()
        service = self.service()
        golden = model.last_golden if model else None
        cpu = self.resources.cpu_percent() if cpu is None else cpu
        streaming = generative and model is not None and bool(model.generative.active)  # type: ignore[union-attr]
        idle = requests == 0 and errors == 0 and not streaming  # no client request in the window
        quality = parts.quality.telemetry_fields(model) if parts is not None else {}
        return Telemetry(
            device_id=self.serving.identity.device_id,
            slot=parts.name if parts is not None else "default",
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
            errors_by_kind=self._errors_by_kind(service, stats, first=first),
            spool_depth=spool.depth,
            spool_dropped=spool.dropped,
            seq=spool.seq,
            link=self.link.report(),
            generation=self.generations.generation.snapshot() if generative else None,
            scheduling=self._scheduling(model),
            **quality,
        )

    def _scheduling(self, model: LoadedModel | None) -> SlotTiming | None:
        """The scheduler's queue and compute time for the slot's model over the window (the gate keys by model)."""
        if self.compute is None or model is None:
            return None
        window = self.compute.window(model.manifest.model_name)
        return SlotTiming(**window.fields()) if window is not None else None

    def _errors_by_kind(self, service: InferenceService | None, stats: RequestStats, *, first: bool) -> dict[str, int]:
        """The local API's refusals and failures by kind, and MQTT inference's refusals ("mqtt:" kinds); the
        device-wide ones (the local API's, refusals before a slot was known) in the first slot's report only."""
        found = stats.refused_by_kind()
        if first:
            found = {k[0]: int(v) for k, v in service.metrics.errors.items()} if service else {}
            for kind, n in {**self.refusals.refused_by_kind()}.items():
                found[kind] = found.get(kind, 0) + n
            for kind, n in stats.refused_by_kind().items():
                found[kind] = found.get(kind, 0) + n
        return found


__all__ = ["Heartbeat"]
