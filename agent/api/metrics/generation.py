"""Generation metrics under OpenTelemetry's gen_ai semantic conventions, in their Prometheus form.

OpenTelemetry (semantic-conventions, docs/gen-ai/gen-ai-metrics.md, Development status) names the model server's
histograms `gen_ai.server.time_to_first_token` and `gen_ai.server.time_per_output_token` (unit s), and token counts
`gen_ai.client.token.usage` (a histogram of tokens per operation, unit `{token}`, attribute `gen_ai.token.type`
input | output; the conventions define it for clients only, the agent counts its own). The Prometheus names follow
OpenTelemetry's mapping: dots become underscores, the unit `s` adds `_seconds`, a `{...}` unit adds nothing:

    gen_ai_server_time_to_first_token_seconds     histogram
    gen_ai_server_time_per_output_token_seconds   histogram
    gen_ai_client_token_usage                     histogram, label gen_ai_token_type
    edgefleet_generations_refused_total{reason}, edgefleet_generations_cut_total{model}

Labels: gen_ai_operation_name (text_completion | chat), gen_ai_provider_name ("edgefleet"), gen_ai_request_model (the
model name), gen_ai_response_model (the bundle id that answered). Bucket bounds are the conventions' own, with finer
ones below their smallest: a small model on a CPU answers a token in well under the conventions' first 10 ms.
"""

from __future__ import annotations

import threading

from edgefleet.agent.api.metrics.histograms import Counter, Histogram

PROVIDER_NAME = "edgefleet"
TTFT_BOUNDS_MS = tuple(1000 * b for b in (
    0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
))  # fmt: skip
TPOT_BOUNDS_MS = tuple(1000 * b for b in (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
))  # fmt: skip
TOKEN_BOUNDS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

Key = tuple[str, str, str]  # (operation, model, bundle id)


class GenerationMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft: dict[Key, Histogram] = {}
        self.tpot: dict[Key, Histogram] = {}
        self.tokens: dict[tuple[str, str, str, str], Histogram] = {}  # (operation, model, bundle, input|output)
        self.refused = Counter()  # (reason,)
        self.cut = Counter()  # (model,)

    def observe(
        self,
        operation: str,
        model: str,
        bundle_id: str,
        *,
        prompt_tokens: int,
        output_tokens: int,
        ttft_ms: float | None,
        tpot_ms: float | None,
    ) -> None:
        key = (operation, model, bundle_id)
        with self._lock:
            if ttft_ms is not None:
                self.ttft.setdefault(key, Histogram(TTFT_BOUNDS_MS)).observe(ttft_ms)
            if tpot_ms is not None:
                self.tpot.setdefault(key, Histogram(TPOT_BOUNDS_MS)).observe(tpot_ms)
            for kind, count in (("input", prompt_tokens), ("output", output_tokens)):
                self.tokens.setdefault((*key, kind), Histogram(TOKEN_BOUNDS)).observe(float(count))

    def empty(self) -> bool:
        return not (self.ttft or self.tpot or self.tokens or self.refused.items() or self.cut.items())

    def series(
        self,
    ) -> tuple[list[tuple[Key, Histogram]], list[tuple[Key, Histogram]], list[tuple[tuple[str, ...], Histogram]]]:
        with self._lock:
            return sorted(self.ttft.items()), sorted(self.tpot.items()), sorted(self.tokens.items())


__all__ = ["PROVIDER_NAME", "TOKEN_BOUNDS", "TPOT_BOUNDS_MS", "TTFT_BOUNDS_MS", "GenerationMetrics"]
