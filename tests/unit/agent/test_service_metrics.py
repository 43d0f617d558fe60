"""Latency histogram: fixed buckets, percentile estimates, thread safety; the /metrics page."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgefleet.agent.api.metrics.histograms import Histogram, ServiceMetrics
from edgefleet.agent.api.metrics.page import MetricsPage


def test_percentiles_from_buckets_track_the_real_ones() -> None:
    values = np.random.default_rng(1).lognormal(mean=-3.0, sigma=0.6, size=20_000)  # ms, around 0.05
    histogram = Histogram()
    for value in values:
        histogram.observe(float(value))
    estimates = histogram.snapshot().percentiles()
    for estimate, exact in zip(estimates, np.percentile(values, [50, 95, 99]), strict=True):
        assert estimate is not None and abs(estimate - exact) / exact < 0.2


def test_an_empty_histogram_has_no_percentiles_and_one_value_is_exact() -> None:
    histogram = Histogram()
    assert histogram.snapshot().percentiles() == (None, None, None)
    histogram.observe(3.3)
    assert histogram.snapshot().percentiles() == (3.3, 3.3, 3.3)
    histogram.observe(99_999.0)  # beyond the last bucket: +Inf, clamped to the largest value seen
    assert histogram.snapshot().quantile(1.0) == 99_999.0


def test_observations_from_many_threads_are_all_counted() -> None:
    histogram = Histogram()

    def worker() -> None:
        for _ in range(5000):
            histogram.observe(0.1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = histogram.snapshot(reset=True)
    assert snap.count == 40_000 and sum(snap.counts) == 40_000
    assert histogram.snapshot().count == 0


def test_bucket_bounds_must_increase() -> None:
    with pytest.raises(ValueError):
        Histogram([1.0, 0.5])


def test_the_page_escapes_labels_and_writes_cumulative_buckets_in_seconds() -> None:
    metrics = ServiceMetrics(bounds_ms=[1.0, 10.0])
    metrics.observe('we"ird\\model', "b-1", "openvino:CPU", 0.5)
    metrics.observe('we"ird\\model', "b-1", "openvino:CPU", 5.0)
    page, content_type = MetricsPage(metrics).render()
    text = page.decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'model="we\\"ird\\\\model"' in text
    buckets = {line.split('le="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line.startswith("edgefleet_inference_latency_seconds_bucket")}  # fmt: skip
    assert buckets == {"0.001": "1.0", "0.01": "2.0", "+Inf": "2.0"}
    assert "edgefleet_inference_latency_seconds_sum" in text and text.endswith("\n")
    assert "process_resident_memory_bytes" in text or "process_" not in text  # Linux has /proc; others skip it


def test_counters_have_total_and_created_and_openmetrics_is_negotiated() -> None:
    metrics = ServiceMetrics()
    metrics.requests.inc("m", "200")
    metrics.failure("m")
    page = MetricsPage(metrics)
    text = page.render()[0].decode()
    assert 'edgefleet_requests_total{code="200",model="m"} 1.0' in text
    assert 'edgefleet_requests_created{code="200",model="m"}' in text
    assert 'edgefleet_model_failures_total{model="m"} 1.0' in text
    body, content_type = page.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    open_metrics = body.decode()
    assert "# TYPE edgefleet_requests counter" in open_metrics and open_metrics.endswith("# EOF\n")
    assert "edgefleet_model_info{bundle_id=" not in open_metrics or "# TYPE edgefleet_model info" in open_metrics
