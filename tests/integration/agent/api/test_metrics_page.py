"""The agent writes its /metrics page itself (agent/api/metrics/exposition.py), without prometheus_client on the device:
the page must be what prometheus_client wrote for the same metrics, byte for byte, in both formats, and parse with
prometheus_client's own parsers. prometheus_client is imported here, in the test only."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import Collector

from edgefleet.agent.api.metrics.exposition import go_float, negotiate
from edgefleet.agent.api.metrics.histograms import ERROR_KINDS, Counter, ServiceMetrics
from edgefleet.agent.api.metrics.page import MetricsPage

from support.paths import REPO


def _counter(name: str, help_text: str, labels: list[str], counter: Counter) -> CounterMetricFamily:
    family = CounterMetricFamily(f"edgefleet_{name}", help_text, labels=labels)
    for values, value in counter.items():
        family.add_metric(list(values), value, created=counter.created(values))
    return family


class ReferenceCollector(Collector):
    """The collector the agent used with prometheus_client (before it wrote the page itself): the reference."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        latency = HistogramMetricFamily("edgefleet_inference_latency_seconds", "Inference latency inside the "
                                        "service.", labels=["model", "bundle_id", "provider", "slot"])  # fmt: skip
        for labels, histogram in m.latencies():
            snap = histogram.snapshot()
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, n in zip((*snap.bounds_ms, math.inf), snap.counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if math.isinf(bound) else repr(bound / 1000), cumulative))
            latency.add_metric([*labels, m.slot_of(labels[0])], buckets, snap.sum_ms / 1000)
        yield latency
        yield _counter("requests", "HTTP inference requests by model and status code.", ["model", "code"], m.requests)
        errors = CounterMetricFamily("edgefleet_errors", "Answers other than 200 by kind: refusals (the caller's "
                                     "fault or a full agent) and 'runtime' (the model's own run failed).",
                                     labels=["kind"])  # fmt: skip
        seen = dict(m.errors.items())
        for kind in sorted(set(ERROR_KINDS) | {k[0] for k in seen}):
            errors.add_metric([kind], seen.get((kind,), 0.0), created=m.errors.created((kind,)))
        yield errors
        yield _counter("model_failures", "Runs of the model that failed on valid input: the only requests that "
                       "count against the model's health.", ["model"], m.failures)  # fmt: skip
        yield _counter("model_swaps", "Hot swaps of a served model.", ["model"], m.swaps)
        yield _counter("connections_closed", "Connections the server closed, by reason (timeouts, evictions).",
                       ["reason"], m.closed)  # fmt: skip
        yield GaugeMetricFamily("edgefleet_queue_depth", "Requests admitted and waiting for an inference slot.",
                                value=m.queue_depth())  # fmt: skip
        yield GaugeMetricFamily("edgefleet_in_flight", "Requests running inference now.", value=m.in_flight())
        yield GaugeMetricFamily("edgefleet_open_connections", "Client connections open now.",
                                value=m.open_connections())  # fmt: skip
        info = InfoMetricFamily("edgefleet_model", "Models served, with their bundle and provider.",
                                labels=["model", "bundle_id", "provider", "slot"])  # fmt: skip
        for model, bundle, provider in m.models():
            info.add_metric([model, bundle, provider, m.slot_of(model)], {})
        yield info
        accuracy = GaugeMetricFamily("edgefleet_field_accuracy", "Share of correct answers among those given "
                                     "feedback.", labels=["model"])  # fmt: skip
        samples = GaugeMetricFamily("edgefleet_field_feedback", "Feedbacks the field accuracy is computed over.",
                                    labels=["model"])  # fmt: skip
        for model, value, n in m.field_accuracy():
            accuracy.add_metric([model], value)
            samples.add_metric([model], n)
        yield accuracy
        yield samples


def _reference(metrics: ServiceMetrics, accept: str) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(ReferenceCollector(metrics))
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def _busy_metrics() -> ServiceMetrics:
    metrics = ServiceMetrics()
    for ms in (0.01, 0.03, 0.3, 2.5, 40.0, 99_999.0):
        metrics.observe('we"ird\\mo\ndel', "b-1", "openvino:CPU", ms)
    metrics.observe("digits", "digits-1", "CPUExecutionProvider", 0.02)
    for code in ("200", "200", "400", "503"):
        metrics.requests.inc("digits", code)
    for kind in ("bad-request", "overloaded", "runtime"):
        metrics.error(kind)
    metrics.failure("digits")
    metrics.swaps.inc("digits")
    metrics.closed.inc("idle-timeout", amount=3)
    metrics.queue_depth, metrics.in_flight, metrics.open_connections = (lambda: 2), (lambda: 1), (lambda: 12_345_678)
    metrics.models = lambda: [("digits", "digits-1", "CPUExecutionProvider"), ("x", "x\\1", 'q"uote')]
    metrics.field_accuracy = lambda: [("digits", 0.875, 8)]
    return metrics


_PROCESS_VALUE = re.compile(r"^(process_\S+) .*$")


def _masked(page: bytes) -> list[str]:
    """The page's lines with the process values (which change between two reads of /proc) masked."""
    return [_PROCESS_VALUE.sub(r"\1 <value>", line) for line in page.decode().splitlines()]


ACCEPTS = [
    "",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=bogus",
    "application/openmetrics-text; version=0.0.1,text/plain;q=0.5",
    "application/json, */*",
]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_page_is_what_prometheus_client_writes_for_the_same_metrics(accept: str) -> None:
    for metrics in (ServiceMetrics(), _busy_metrics()):
        ours, our_type = MetricsPage(metrics).render(accept)
        theirs, their_type = _reference(metrics, accept)
        assert our_type == their_type
        assert _masked(ours) == _masked(theirs)


def test_the_values_escaping_leaves_valid_names_as_they_are() -> None:
    """prometheus_client 0.26 prefixes every OpenMetrics sample name with U__ under escaping=values, also valid ones,
    so its samples no longer match their own # TYPE line; the escaping scheme leaves valid legacy names alone, and
    so does the agent (all its names are valid: the page is the underscores one)."""
    metrics = _busy_metrics()
    accept = "application/openmetrics-text; version=1.0.0; escaping=values"
    ours, our_type = MetricsPage(metrics).render(accept)
    assert our_type == _reference(metrics, accept)[1]
    underscores = MetricsPage(metrics).render("application/openmetrics-text; version=1.0.0; escaping=underscores")
    assert _masked(ours) == _masked(underscores[0])
    assert {f.name for f in parse_openmetrics(ours.decode())} >= {"edgefleet_requests", "process_cpu_seconds"}


def test_the_page_parses_with_prometheus_clients_parsers_in_both_formats() -> None:
    page = MetricsPage(_busy_metrics())
    text, _ = page.render()
    families = {f.name: f for f in parse_text(text.decode())}
    assert families["edgefleet_requests"].type == "counter"
    assert {(s.labels["code"], s.value) for s in families["edgefleet_requests"].samples
            if s.name == "edgefleet_requests_total"} == {("200", 2.0), ("400", 1.0), ("503", 1.0)}  # fmt: skip
    latency = families["edgefleet_inference_latency_seconds"]
    weird = [s for s in latency.samples if s.labels.get("model") == 'we"ird\\mo\ndel']
    assert {s.labels["le"]: s.value for s in weird if s.name.endswith("_bucket")}["+Inf"] == 6.0
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    openmetrics, content_type = page.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    parsed = {f.name: f for f in parse_openmetrics(openmetrics.decode())}  # strict: # EOF, _created, info, order
    assert parsed["edgefleet_model"].type == "info"
    assert parsed["edgefleet_open_connections"].samples[0].value == 12_345_678


def test_floats_are_written_as_go_writes_them() -> None:
    assert [go_float(v) for v in (1, 0.5, 1e7, 12_345_678, 1.796e9, 1e-7, math.inf, -math.inf)] == [
        "1.0", "0.5", "1e+07", "1.2345678e+07", "1.796e+09", "1e-07", "+Inf", "-Inf"
    ]  # fmt: skip
    assert go_float(math.nan) == "NaN"


def test_a_malformed_accept_version_gets_the_classic_text_format() -> None:
    assert negotiate("application/openmetrics-text; version=x.y") == (
        False, "text/plain; version=0.0.4; charset=utf-8", "underscores"
    )  # fmt: skip


def test_a_scraped_agent_never_imports_prometheus_client() -> None:
    code = (
        "import sys; from edgefleet.agent.api.metrics.histograms import ServiceMetrics\n"
        "from edgefleet.agent.api.metrics.page import MetricsPage\n"
        "m = ServiceMetrics(); m.requests.inc('m', '200')\n"
        "MetricsPage(m).render(); MetricsPage(m).render('application/openmetrics-text')\n"
        "print(any(n.startswith('prometheus_client') for n in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
