"""The agent's /metrics page from ServiceMetrics, the process and the platform (agent/api/metrics/exposition.py writes
it).

The families and their order are those the agent exposed through prometheus_client: the process metrics (CPU,
memory, file descriptors, start time, read from /proc as prometheus_client's process collector reads them),
`python_info`, then the service's own. `render(accept)` negotiates the format: OpenMetrics 1.0 when the scraper
asks for `application/openmetrics-text`, else the Prometheus text format 0.0.4. Counters carry `_total` and, per
series, `_created`.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

from edgefleet.agent.api.metrics.exposition import (
    Family,
    count,
    counter,
    gauge,
    negotiate,
    render_openmetrics,
    render_text,
)
from edgefleet.agent.api.metrics.generation import PROVIDER_NAME, GenerationMetrics
from edgefleet.agent.api.metrics.histograms import ERROR_KINDS, Counter, Histogram, ServiceMetrics

PREFIX = "edgefleet"
_PROC = Path("/proc")


def _sysconf(name: str, default: int) -> float:
    try:
        return float(os.sysconf(name))
    except (ValueError, TypeError, AttributeError, OSError):
        return float(default)


class _Process:
    """process_* metrics from /proc (none where there is no /proc, as with prometheus_client)."""

    def __init__(self) -> None:
        self.ticks = _sysconf("SC_CLK_TCK", 100)
        self.pagesize = _sysconf("SC_PAGESIZE", 4096)
        self.boot_time = 0.0
        try:
            for line in (_PROC / "stat").read_bytes().splitlines():
                if line.startswith(b"btime "):
                    self.boot_time = float(line.split()[1])
        except OSError:
            pass

    def families(self) -> list[Family]:
        if not self.boot_time:
            return []
        found: list[Family] = []
        me = _PROC / "self"
        try:
            parts = (me / "stat").read_bytes().split(b")")[-1].split()
            cpu = counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")
            cpu.add("_total", {}, float(parts[11]) / self.ticks + float(parts[12]) / self.ticks)
            found += [
                gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(parts[20])),
                gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                      float(parts[21]) * self.pagesize),
                gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      float(parts[19]) / self.ticks + self.boot_time),
                cpu,
            ]  # fmt: skip
        except OSError:
            pass
        try:
            max_fds = None
            for line in (me / "limits").read_bytes().splitlines():
                if line.startswith(b"Max open file"):
                    max_fds = gauge("process_max_fds", "Maximum number of open file descriptors.",
                                    float(line.split()[3]))  # fmt: skip
                    break
            open_fds = gauge("process_open_fds", "Number of open file descriptors.", len(os.listdir(me / "fd")))
            if max_fds is not None:
                found += [open_fds, max_fds]
        except OSError:
            pass
        return found


def _platform() -> Family:
    major, minor, patchlevel = platform.python_version_tuple()
    info = gauge("python_info", "Python platform information")
    info.add("", {"version": platform.python_version(), "implementation": platform.python_implementation(),
                  "major": major, "minor": minor, "patchlevel": patchlevel}, 1.0)  # fmt: skip
    return info


def _counter(name: str, help_text: str, labels: list[str], source: Counter) -> Family:
    family = counter(f"{PREFIX}_{name}", help_text)
    for values, value in source.items():
        count(family, dict(zip(labels, values, strict=True)), value, source.created(values))
    return family


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(names, values, strict=True))


def service_families(m: ServiceMetrics) -> list[Family]:
    """The service's own families, in the order the page has always listed them."""
    model_labels = ("model", "bundle_id", "provider")
    latency = Family(f"{PREFIX}_inference_latency_seconds", "histogram", "Inference latency inside the service.")
    for values, histogram in m.latencies():
        snap = histogram.snapshot()
        labels = {**_labels(model_labels, values), "slot": m.slot_of(values[0])}
        cumulative = 0
        for bound, n in zip((*snap.bounds_ms, math.inf), snap.counts, strict=True):
            cumulative += n
            latency.add("_bucket", {**labels, "le": "+Inf" if math.isinf(bound) else repr(bound / 1000)}, cumulative)
        latency.add("_count", labels, cumulative)
        latency.add("_sum", labels, snap.sum_ms / 1000)
    errors = counter(f"{PREFIX}_errors", "Answers other than 200 by kind: refusals (the caller's fault or a full "
                     "agent) and 'runtime' (the model's own run failed).")  # fmt: skip
    seen = dict(m.errors.items())
    for kind in sorted(set(ERROR_KINDS) | {k[0] for k in seen}):
        count(errors, {"kind": kind}, seen.get((kind,), 0.0), m.errors.created((kind,)))
    info = Family(f"{PREFIX}_model", "info", "Models served, with their bundle and provider.")
    for values in m.models():
        info.add("_info", {**_labels(model_labels, tuple(values)), "slot": m.slot_of(values[0])}, 1.0)
    field = list(m.field_accuracy())
    accuracy = gauge(f"{PREFIX}_field_accuracy", "Share of correct answers among those given feedback.")
    samples = gauge(f"{PREFIX}_field_feedback", "Feedbacks the field accuracy is computed over.")
    for model, value, n in field:
        accuracy.add("", {"model": model}, value)
        samples.add("", {"model": model}, n)
    failures = _counter(
        "model_failures", "Runs of the model that failed on valid input: the only requests that count against the "
        "model's health.", ["model"], m.failures,
    )  # fmt: skip
    closed = _counter(
        "connections_closed", "Connections the server closed, by reason (timeouts, evictions).", ["reason"], m.closed
    )
    return [
        latency,
        _counter("requests", "HTTP inference requests by model and status code.", ["model", "code"], m.requests),
        errors,
        failures,
        _counter("model_swaps", "Hot swaps of a served model.", ["model"], m.swaps),
        closed,
        gauge(f"{PREFIX}_queue_depth", "Requests admitted and waiting for an inference slot.", m.queue_depth()),
        gauge(f"{PREFIX}_in_flight", "Requests running inference now.", m.in_flight()),
        gauge(f"{PREFIX}_open_connections", "Client connections open now.", m.open_connections()),
        info,
        accuracy,
        samples,
    ]


def _histogram(family: Family, labels: dict[str, str], histogram: Histogram, scale: float) -> None:
    snap = histogram.snapshot()
    cumulative = 0
    for bound, n in zip((*snap.bounds_ms, math.inf), snap.counts, strict=True):
        cumulative += n
        family.add("_bucket", {**labels, "le": "+Inf" if math.isinf(bound) else repr(bound * scale)}, cumulative)
    family.add("_count", labels, cumulative)
    family.add("_sum", labels, snap.sum_ms * scale)


def generation_families(g: GenerationMetrics) -> list[Family]:
    """The gen_ai families (agent/api/metrics/generation.py), once there was a generation or a refusal."""
    if g.empty():
        return []
    ttft, tpot, tokens = g.series()

    def labels(operation: str, model: str, bundle: str) -> dict[str, str]:
        return {"gen_ai_operation_name": operation, "gen_ai_provider_name": PROVIDER_NAME,
                "gen_ai_request_model": model, "gen_ai_response_model": bundle}  # fmt: skip

    first = Family("gen_ai_server_time_to_first_token_seconds", "histogram",
                   "Time to generate first token for successful responses.")  # fmt: skip
    for key, histogram in ttft:
        _histogram(first, labels(*key), histogram, 1e-3)
    per_token = Family("gen_ai_server_time_per_output_token_seconds", "histogram",
                       "Time per output token generated after the first token for successful responses.")  # fmt: skip
    for key, histogram in tpot:
        _histogram(per_token, labels(*key), histogram, 1e-3)
    usage = Family("gen_ai_client_token_usage", "histogram", "Number of input and output tokens used.")
    for (operation, model, bundle, kind), histogram in tokens:
        _histogram(usage, {**labels(operation, model, bundle), "gen_ai_token_type": kind}, histogram, 1.0)
    refused = _counter("generations_refused", "Generation requests refused: busy, over the token budget, bad input.",
                       ["reason"], g.refused)  # fmt: skip
    cut = _counter("generations_cut", "Generations ended early: the client went away, or a swap's drain ran out.",
                   ["model"], g.cut)  # fmt: skip
    return [first, per_token, usage, refused, cut]


class MetricsPage:
    def __init__(self, metrics: ServiceMetrics, generation: GenerationMetrics | None = None) -> None:
        self.metrics, self.generation = metrics, generation
        self._process = _Process()
        self._platform = _platform()

    def families(self) -> list[Family]:
        found = [*self._process.families(), self._platform, *service_families(self.metrics)]
        if self.generation is not None:
            found += generation_families(self.generation)
        return found

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(page, content type) in the format the Accept header asks for."""
        openmetrics, content_type, escaping = negotiate(accept)
        render = render_openmetrics if openmetrics else render_text
        return render(self.families(), escaping), content_type
