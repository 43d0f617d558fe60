"""Every generation counted in one place, whatever its path (the local API, MQTT; probes count themselves,
agent/quality/probe.py): the telemetry window (`RequestStats.generation`, and a request's latency as its time per
output token), the gen_ai metrics of /metrics, refusals and cuts, and the model's own failures (which count against
its health)."""

from __future__ import annotations

from edgefleet.agent.api.metrics.generation import GenerationMetrics
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.runtime.generative import GenerationResult
from edgefleet.agent.telemetry import RequestStats


class GenerationAccounting:
    def __init__(self, stats: RequestStats, metrics: GenerationMetrics, service: ServiceMetrics | None = None) -> None:
        self.stats, self.metrics, self.service = stats, metrics, service

    def finished(self, operation: str, model: str, bundle_id: str, result: GenerationResult) -> None:
        cut = result.finish_reason == "cancelled"
        output = len(result.tokens)
        self.stats.generation.finished(result.prompt_tokens, output, result.ttft_ms, result.decode_ms, cut=cut)
        tpot = result.tpot_ms
        if tpot is not None:
            self.stats.record(tpot)  # a generative model's request latency: its time per output token
        else:
            self.stats.record_answered()
        self.metrics.observe(
            operation, model, bundle_id, prompt_tokens=result.prompt_tokens, output_tokens=output,
            ttft_ms=result.ttft_ms if output else None, tpot_ms=tpot,
        )  # fmt: skip
        if cut:
            self.metrics.cut.inc(model)

    def refused(self, reason: str) -> None:
        """A generation refused: busy, over its budget, bad input, unknown model."""
        self.stats.generation.refused()
        self.metrics.refused.inc(reason)

    def failed(self, model: str) -> None:
        """The model's own generation failed on a request that passed every check."""
        self.stats.record_failure()
        if self.service is not None:
            self.service.failure(model)


__all__ = ["GenerationAccounting"]
