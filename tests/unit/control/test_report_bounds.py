"""Numbers from devices are bounded where a report is parsed (core/messages.py, MAX_*) and admitted
(control/fleet/admission.py: timestamps near the time received, CPU under 100 × the device's cores); what the
control plane serves is strict JSON (core/untrusted.py). Issue 32, item 5."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest

from edgefleet.control.fleet.admission import Admission, AdmissionError
from edgefleet.control.fleet.ingest import _out_of_range
from edgefleet.core.messages import (
    MAX_COUNT,
    MAX_WINDOW_COUNT,
    DeviceStatus,
    Event,
    Hardware,
    MessageError,
    Telemetry,
    decode,
)
from edgefleet.core.untrusted import safe_json, strict_json

NOW = 1_800_000_000.0


def payload(**changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema_version": 1, "device_id": "d1", "seq": 1, "ts": NOW, "bundle_id": None, "provider": "cpu",
        "window_s": 10.0, "requests": 5, "errors": 0, "throughput_rps": 0.5,
        "latency": {"count": 5, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}, "golden_agreement": 1.0,
        "golden_max_abs_error": 0.0, "cpu_percent": 50.0, "rss_mb": 100.0,
    }  # fmt: skip
    report.update(changes)
    return report


def parse(report: dict[str, Any]) -> Telemetry:
    return decode(Telemetry, json.dumps(report).encode())  # Python's json writes NaN and Infinity, as an attacker may


def test_a_plausible_report_parses_unchanged() -> None:
    assert parse(payload()).latency.p95_ms == 2.0


@pytest.mark.parametrize(
    "changes",
    [
        {"latency": {"count": 1, "p50_ms": 1.0, "p95_ms": math.inf, "p99_ms": 1.0}},  # attack 4
        {"latency": {"count": 1, "p50_ms": 1.0, "p95_ms": 3_600_000.0, "p99_ms": 1.0}},  # an hour
        {"requests": 2**62},  # attack 5
        {"requests": -1},
        {"errors": MAX_WINDOW_COUNT + 1},
        {"cpu_percent": -math.inf},
        {"cpu_percent": -1.0},
        {"cpu_percent": math.nan},
        {"rss_mb": -5.0},
        {"golden_agreement": 1.5},
        {"field_accuracy": -0.1},
        {"throughput_rps": math.inf},
        {"window_s": -1.0},
        {"temperature_c": 1e6},
        {"seq": MAX_COUNT + 1},
        {"spool_dropped": -3},
        {"ts": 1e15},
        {"ts": math.inf},
        {"errors_by_kind": {"busy": -1}},
        {"golden_scores": [{"output": "y", "rule": "continuous", "score": math.nan, "passed": True}]},
        {
            "golden_scores": [
                {"output": "y", "rule": "continuous", "score": 0.9, "passed": True, "detail": {"sqnr_db": math.inf}}
            ]
        },
        {"drift": [{"name": "x", "kind": "input", "psi": -1.0, "band": "none", "samples": 1}]},
        {"link": {"bulk_bytes": -1}},
        {"link": {"srtt_ms": math.inf}},
        {"generation": {"output_tokens": 2**40}},
        {"shadow": {"bundle_id": "b", "requests": 1, "agreement": 2.0}},
    ],
    ids=lambda c: ",".join(c),
)
def test_a_number_outside_its_range_refuses_the_report_as_out_of_range(changes: dict[str, Any]) -> None:
    with pytest.raises(MessageError) as refused:
        parse(payload(**changes))
    assert _out_of_range(refused.value), refused.value


def test_a_malformed_report_is_told_apart_from_an_out_of_range_one() -> None:
    with pytest.raises(MessageError) as refused:
        parse(payload(requests="many"))
    assert not _out_of_range(refused.value)


def test_events_and_statuses_are_bounded_too() -> None:
    with pytest.raises(MessageError):
        decode(Event, json.dumps({"device_id": "d1", "kind": "error", "seq": -1, "ts": NOW}).encode())
    with pytest.raises(MessageError):
        decode(Event, json.dumps({"device_id": "d1", "kind": "error", "ts": NOW, "progress": math.nan}).encode())
    hardware = {"arch": "x", "os": "linux", "cpu_count": 0, "memory_mb": 1, "hostname": "h"}
    status = {"device_id": "d1", "online": True, "state": "idle", "ts": NOW, "hardware": hardware}
    with pytest.raises(MessageError):
        decode(DeviceStatus, json.dumps(status).encode())


def test_a_golden_check_that_failed_reports_no_error_figure_rather_than_infinity() -> None:
    """The agent records a failed golden run's error as infinite; the wire has always carried that as null."""
    report = Telemetry.model_validate(payload(golden_max_abs_error=math.inf))
    assert report.golden_max_abs_error is None and "Infinity" not in report.encode().decode()


@pytest.mark.parametrize(
    ("ts", "admitted"),
    [(NOW, True), (NOW + 299, True), (NOW + 301, False), (NOW - 6 * 86400, True), (NOW - 8 * 86400, False),
     (0.0, False)],
)  # fmt: skip
def test_a_report_is_admitted_only_when_dated_near_the_time_received(ts: float, admitted: bool) -> None:
    report = parse(payload(ts=ts))
    if admitted:
        assert Admission().admit(report, NOW) == report
        return
    with pytest.raises(AdmissionError, match="timestamp") as refused:
        Admission().admit(report, NOW)
    assert refused.value.reason == "out_of_range"


def test_a_status_may_be_old_but_not_from_the_future() -> None:
    """A retained status, or a last will made when its connection was, is old by nature; a future one is refused."""
    old = DeviceStatus(device_id="d1", online=False, state="offline", ts=NOW - 90 * 86400)
    assert Admission().admit(old, NOW) == old
    with pytest.raises(AdmissionError, match="timestamp"):
        Admission().admit(old.model_copy(update={"ts": NOW + 3600}), NOW)


def test_cpu_is_bounded_by_the_cores_the_devices_status_names() -> None:
    gate = Admission()
    hardware = Hardware(arch="x86_64", os="linux", cpu_count=2, memory_mb=1024, hostname="h")
    gate.admit(DeviceStatus(device_id="d1", online=True, state="idle", ts=NOW, hardware=hardware), NOW)
    assert gate.admit(parse(payload(cpu_percent=205.0)), NOW).cpu_percent == 205.0  # 5 % for sampling jitter
    with pytest.raises(AdmissionError, match="2 cores") as refused:
        gate.admit(parse(payload(cpu_percent=250.0)), NOW)
    assert refused.value.reason == "out_of_range"
    assert gate.admit(parse(payload(device_id="d2", cpu_percent=250.0)), NOW).cpu_percent == 250.0  # cores unknown


def test_what_the_control_plane_serves_is_strict_json() -> None:
    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the answer"))

    value = {"p95": math.inf, "cpu": [-math.inf, 1.5], "nan": math.nan, "ok": "text", "counts": Counter(a=1)}
    assert strict(json.dumps(safe_json(value), allow_nan=False)) == {
        "p95": None, "cpu": [None, 1.5], "nan": None, "ok": "text", "counts": {"a": 1}
    }  # fmt: skip
    assert strict(json.dumps(strict_json(value), allow_nan=False))["cpu"] == [None, 1.5]
