"""Rollout logic as pure functions, tested with tables: wave plans, spec sanity, telemetry summaries, verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.control.fleet.registry import EmptyGroupError
from edgefleet.control.rollout.engine import make_spec
from edgefleet.control.rollout.judge.wave import Metrics, Thresholds, breached, judge_device, pending, summarize
from edgefleet.control.rollout.plan import BundleRef, RolloutSpecError, order_devices, parse_size, plan_waves
from edgefleet.control.store import TelemetryPoint

DEVICES = [f"d{i:02d}" for i in range(10)]


@pytest.mark.parametrize(
    ("total", "canary", "waves", "sizes"),
    [
        (10, "1", ["25%", "50%", "100%"], [1, 2, 2, 5]),
        (10, "10%", ["50%", "100%"], [1, 4, 5]),
        (10, "2", ["5", "10"], [2, 3, 5]),
        (10, "1", ["50%"], [1, 4, 5]),  # a last wave to 100% is added
        (4, "1", ["25%", "50%", "100%"], [1, 1, 2]),  # 25% of 4 is the canary already: that wave adds nothing
        (3, "1", ["25%", "50%", "100%"], [1, 1, 1]),
        (1, "1", ["25%", "50%", "100%"], [1]),
        (1, "50%", ["100%"], [1]),  # a share rounds up to at least one device
        (7, "3", ["100%"], [3, 4]),
        (10, "1", ["12", "20"], [1, 9]),  # counts larger than the group are capped
    ],
)
def test_wave_plans(total: int, canary: str, waves: list[str], sizes: list[int]) -> None:
    plan = plan_waves(DEVICES[:total], canary, waves)
    assert [len(w) for w in plan] == sizes
    assert [d for wave in plan for d in wave] == DEVICES[:total], "every device exactly once, in order"


def test_an_empty_group_has_no_plan() -> None:
    with pytest.raises(EmptyGroupError):
        plan_waves([], "1", ["100%"])


def test_a_canary_larger_than_the_group_is_refused() -> None:
    with pytest.raises(RolloutSpecError, match="canary of 5 devices is more than the group's 3"):
        plan_waves(DEVICES[:3], "5", ["100%"])


@pytest.mark.parametrize(
    ("text", "parsed"), [("3", (3.0, False)), ("10%", (10.0, True)), (" 2.5% ", (2.5, True)), ("100%", (100.0, True))]
)
def test_wave_sizes_parse(text: str, parsed: tuple[float, bool]) -> None:
    assert parse_size(text) == parsed


@pytest.mark.parametrize("text", ["0", "-1", "abc", "1.5", "0%", "%", ""])
def test_bad_wave_sizes_are_refused(text: str) -> None:
    with pytest.raises(RolloutSpecError):
        parse_size(text)


def test_device_order_puts_online_devices_first_and_is_stable_per_rollout() -> None:
    online = [i % 3 != 0 for i in range(10)]
    ordered = order_devices(DEVICES, online, "rollout-a")
    assert ordered == order_devices(DEVICES, online, "rollout-a")
    assert sorted(ordered) == DEVICES
    first_offline = next(i for i, d in enumerate(ordered) if not online[DEVICES.index(d)])
    assert all(not online[DEVICES.index(d)] for d in ordered[first_offline:])
    assert order_devices(DEVICES, online, "rollout-b") != ordered, "a different rollout picks another canary"


BUNDLE = BundleRef(bundle_id="m-2-p", model_name="m", model_version="2", profile="p")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"thresholds": {"max_latency_factor": 0.8}}, "max latency factor 0.8 must be between 1 and 1000"),
        ({"thresholds": {"max_latency_factor": -2}}, "max latency factor -2"),
        ({"thresholds": {"max_golden_drop": 1.5}}, "max golden drop 1.5 must be in [0, 1)"),
        ({"thresholds": {"min_golden_agreement": 0}}, "min golden agreement 0 must be in (0, 1]"),
        ({"thresholds": {"max_error_rate": 1.0}}, "max error rate 1 must be in [0, 1)"),
        ({"thresholds": {"min_requests": 0}}, "min requests 0 must be at least 1"),
        ({"timing": {"observe_s": 0}}, "observe and install timeout > 0 s"),
        ({"timing": {"baseline_s": -1}}, "baseline and report timeout must be ≥ 0 s"),
        ({"timing": {"min_reports": 0}}, "min reports must be at least 1"),
        ({"canary": "0"}, "wave size '0' must be more than zero"),
        ({"waves": ["50%", "25%"]}, "waves must grow"),
        ({"waves": ["150%"]}, "more than 100%"),
        ({"max_failed_devices": -1}, "max failed devices must be ≥ 0"),
        ({"group": "a/b"}, "invalid group 'a/b'"),
        ({"bundles": [BUNDLE, BUNDLE]}, "more than one bundle for profile(s) p"),
        ({"bundles": [BUNDLE, BUNDLE.model_copy(update={"model_name": "x", "profile": "q"})]}, "different models"),
        ({"bundles": []}, "bundles"),
    ],
)
def test_senseless_rollouts_get_clear_errors(changes: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"group": "g", "bundles": [BUNDLE], **changes}
    with pytest.raises(RolloutSpecError) as caught:
        make_spec(**fields)
    assert message in str(caught.value)
    assert str(caught.value).startswith("invalid rollout: ")


def test_a_sensible_spec_passes() -> None:
    spec = make_spec(group="g", bundles=[BUNDLE], canary="10%", waves=["50%", "100%"])
    assert spec.bundle_for("p") == BUNDLE and spec.bundle_for("other") is None


def point(ts: float, *, bundle: str = "b2", requests: int = 50, errors: int = 0, p95: float | None = 1.0,
          count: int = 4096, golden: float | None = 1.0, window: float = 1.0) -> TelemetryPoint:  # fmt: skip
    return TelemetryPoint(
        device_id="d", seq=int(ts), ts=ts, bundle_id=bundle, provider="cpu", window_s=window, requests=requests,
        errors=errors, p50_ms=p95, p95_ms=p95, p99_ms=p95, latency_count=count, golden_agreement=golden,
        golden_max_abs_error=0.0, cpu_percent=1.0, rss_mb=1.0, temperature_c=None,
    )  # fmt: skip


def test_summaries_take_only_whole_windows_of_the_bundle_after_since() -> None:
    points = [
        point(100.5, p95=9.0),  # its window started before `since`: straddles the swap
        point(101.5, bundle="b1", p95=9.0),  # another bundle
        point(102.0, p95=1.0, golden=0.9),
        point(103.0, p95=3.0),
        point(104.0, p95=2.0, errors=5),
    ]
    m = summarize(points, bundle_id="b2", since=100.0)
    assert (m.reports, m.requests, m.errors, m.p95_ms, m.golden_agreement) == (3, 150, 5, 2.0, 0.9)
    assert m.error_rate == pytest.approx(5 / 155)


def test_p95_counts_only_once_the_agents_window_holds_mostly_the_new_bundle() -> None:
    # The agent's latency window holds 1000 samples; 100 requests per report: fresh from the 5th report on.
    points = [point(100.0 + i, requests=100, count=1000, p95=float(i)) for i in range(1, 11)]
    m = summarize(points, bundle_id="b2", since=100.0, fresh_since=100.0, min_fresh_share=0.5)
    assert m.fresh_reports == 6 and m.p95_ms == pytest.approx(7.5)
    unfresh = summarize(points[:3], bundle_id="b2", since=100.0, fresh_since=100.0, min_fresh_share=0.5)
    assert unfresh.p95_ms is None and unfresh.requests == 300


def metrics(p95: float | None = 1.0, golden: float | None = 1.0, requests: int = 100, errors: int = 0) -> Metrics:
    return Metrics(bundle_id="b", reports=5, requests=requests, errors=errors, p95_ms=p95, fresh_reports=5,
                   golden_agreement=golden)  # fmt: skip


T = Thresholds(max_latency_factor=1.5, max_golden_drop=0.02, max_error_rate=0.05, min_requests=20)


@pytest.mark.parametrize(
    ("baseline", "observed", "thresholds", "verdict"),
    [
        (metrics(), metrics(p95=1.4), T, {"latency": True, "golden": True, "errors": True}),
        (metrics(), metrics(p95=1.6), T, {"latency": False, "golden": True, "errors": True}),
        (metrics(p95=0.2), metrics(p95=0.35), T.model_copy(update={"latency_slack_ms": 0.1}), {"latency": True}),
        (metrics(), metrics(golden=0.97), T, {"golden": False}),
        (metrics(), metrics(golden=0.98), T, {"golden": True}),
        (metrics(golden=0.9), metrics(golden=0.89), T, {"golden": True}),  # relative to this device's baseline
        (metrics(), metrics(golden=0.99), T.model_copy(update={"min_golden_agreement": 0.995}), {"golden": False}),
        (metrics(), metrics(errors=6, requests=94), T, {"errors": False}),
        (metrics(), metrics(errors=5, requests=95), T, {"errors": True}),
        (None, metrics(p95=50.0), T, {"latency": None, "golden": None}),  # a device that ran nothing before
        (metrics(requests=0, p95=None), metrics(), T, {"latency": None}),  # no traffic before the wave
        (metrics(), metrics(requests=5, p95=9.0), T, {"latency": None, "errors": None}),  # too few requests yet
        (metrics(), metrics(p95=9.0), T.model_copy(update={"max_latency_factor": None}), {"latency": "absent"}),
    ],
)
def test_device_verdicts(
    baseline: Metrics | None, observed: Metrics, thresholds: Thresholds, verdict: dict[str, bool | str | None]
) -> None:
    findings = {f.criterion: f for f in judge_device(baseline, observed, thresholds)}
    for criterion, expected in verdict.items():
        if expected == "absent":
            assert criterion not in findings
        else:
            assert findings[criterion].ok is expected, findings[criterion].detail


def test_findings_say_why() -> None:
    findings = judge_device(metrics(p95=0.5), metrics(p95=2.0, golden=0.5), T)
    latency, golden = (f.detail for f in breached(findings))
    assert latency.startswith(
        "p95 2.000 ms (at least 1.972 ms at 99% confidence, 100 samples against 100) exceeds 1.5 × baseline "
        "0.500 ms = 0.750 ms; baseline: the same model's previous bundle b on this device; to allow it: "
        "--max-latency-factor"
    )
    assert golden.startswith(
        "golden agreement 0.500 is below baseline 1.000 − 0.02 = 0.980; baseline: the previous bundle b on this "
        "device; to allow it: --max-golden-drop, or reconvert with a tighter accuracy budget (edgefleet convert "
        "--max-drop)"
    )


def test_a_criterion_lacking_data_is_pending_never_passed() -> None:
    assert pending(judge_device(metrics(), metrics(requests=5), T))
    quiet = judge_device(metrics(), metrics(requests=0, p95=None), T)
    assert {f.criterion for f in pending(quiet)} == {"latency", "errors"} and not breached(quiet)
    no_baseline = judge_device(metrics(requests=0, p95=None), metrics(), T)
    assert [f.criterion for f in pending(no_baseline)] == ["latency"]
    assert [f.criterion for f in pending(judge_device(None, metrics(), T))] == ["latency", "golden"]
