"""Choosing by the devices' figures (converter/search/farm_choice.py) and picking the devices that measure
(control/farm/devices.py): pure functions, tested with tables."""

from __future__ import annotations

import pytest

from edgefleet.control.farm.devices import for_profile, merge_status, resolve_target
from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.store import DeviceRecord, GroupDef
from edgefleet.converter.search.choose import Candidate, choose
from edgefleet.converter.search.farm_choice import decide, eligible
from edgefleet.core.errors import UserInputError
from edgefleet.core.farm_messages import BenchmarkResult, CandidateFigures, FarmAnswer
from edgefleet.core.messages import DeviceStatus

LIMITS = {"reference": 0.95, "max_drop": 0.01, "size_limit_bytes": 10**9}
# The host timed fp32 faster; INT8 missed nothing. A third candidate missed the accuracy budget.
LOCAL = [
    Candidate("fp32", "fp32", "onnxruntime", 400, accuracy=0.95, latency_ms=1.0, order=1),
    Candidate("int8", "int8-static", "onnxruntime", 100, accuracy=0.945, latency_ms=2.0, order=2),
    Candidate("fp16", "fp16", "onnxruntime", 200, accuracy=0.90, latency_ms=0.5, order=3),
]
NAMES = {"b-fp32": "fp32", "b-int8": "int8"}


def _fig(bundle_id: str, p50: float | None, **extra: object) -> CandidateFigures:
    values = {"ok": True, "provider": "CPUExecutionProvider", "p50_ms": p50, "p90_ms": p50, "p99_ms": p50}
    values |= {"golden_passed": True, "threads": 2, **extra}
    return CandidateFigures(bundle_id=bundle_id, **values)  # type: ignore[arg-type]


def _result(device: str, fp32: float, int8: float, **extra: object) -> BenchmarkResult:
    return BenchmarkResult(
        request_id="r", device_id=device, profile="rpi5-arm64",
        candidates=[_fig("b-fp32", fp32), _fig("b-int8", int8, **extra)],
    )  # fmt: skip


def _choose(candidates: list[Candidate]) -> str | None:
    chosen = choose(candidates, **LIMITS).chosen  # type: ignore[arg-type]
    return chosen.name if chosen else None


def test_only_candidates_inside_the_accuracy_budget_go_to_the_devices() -> None:
    assert eligible(LOCAL, **LIMITS) == ["fp32", "int8"]  # type: ignore[arg-type]


def test_the_devices_figures_decide_over_the_hosts_timing() -> None:
    assert _choose(LOCAL) == "fp32"
    answer = FarmAnswer(results={"pi-1": _result("pi-1", 9.0, 4.0), "pi-2": _result("pi-2", 7.0, 5.0)})
    decision = decide(LOCAL, NAMES, answer)
    assert decision.decided and _choose(decision.candidates) == "int8"
    by_name = {c.name: c for c in decision.candidates}
    assert by_name["int8"].latency_ms == 4.5 and by_name["fp32"].latency_ms == 8.0  # the median of the devices' p50
    assert {m.device_id for m in decision.per_device["int8"]} == {"pi-1", "pi-2"}
    assert all(m.threads == 2 and m.provider == "CPUExecutionProvider" for m in decision.per_device["int8"])
    assert by_name["fp16"].latency_ms == 0.5  # not sent: still rejected by its accuracy, whatever its speed
    assert _choose([by_name["fp16"]]) is None


def test_the_median_over_devices_keeps_one_odd_device_from_deciding() -> None:
    answer = FarmAnswer(
        results={"a": _result("a", 2.0, 3.0), "b": _result("b", 2.1, 3.2), "busy": _result("busy", 50.0, 3.1)}
    )
    assert _choose(decide(LOCAL, NAMES, answer).candidates) == "fp32"


def test_a_candidate_that_fails_on_a_device_is_rejected_with_the_devices_reason() -> None:
    answer = FarmAnswer(results={"pi-1": _result("pi-1", 9.0, 1.0, golden_passed=False)})
    decision = decide(LOCAL, NAMES, answer)
    assert _choose(decision.candidates) == "fp32"
    int8 = next(c for c in decision.candidates if c.name == "int8")
    assert int8.error is not None and "on device pi-1" in int8.error and "golden" in int8.error


def test_silent_devices_leave_the_local_choice_and_are_named() -> None:
    decision = decide(LOCAL, NAMES, FarmAnswer(silent=["pi-3", "pi-4"]))
    assert not decision.decided and decision.candidates == LOCAL
    assert any("pi-3, pi-4" in note for note in decision.notes)
    assert any("stays on this host's timing" in note for note in decision.notes)


def test_devices_that_answered_decide_and_the_silent_ones_are_still_named() -> None:
    decision = decide(LOCAL, NAMES, FarmAnswer(results={"pi-1": _result("pi-1", 9.0, 4.0)}, silent=["pi-2"]))
    assert decision.decided and _choose(decision.candidates) == "int8"
    assert any("pi-2" in note for note in decision.notes)


def test_a_profile_no_device_runs_keeps_its_local_choice() -> None:
    decision = decide(LOCAL, NAMES, FarmAnswer(notes=["no online device of lab runs rpi5-arm64"]))
    assert not decision.decided and decision.candidates == LOCAL
    assert decision.notes[0] == "no online device of lab runs rpi5-arm64"
    assert any(n.startswith("no device was asked") for n in decision.notes)


def test_a_refusal_is_no_measurement() -> None:
    refused = BenchmarkResult(request_id="r", device_id="pi-1", profile="rpi5-arm64", ok=False, error="busy")
    decision = decide(LOCAL, NAMES, FarmAnswer(results={"pi-1": refused}))
    assert not decision.decided and any("pi-1 refused to measure: busy" in n for n in decision.notes)


def _status(device: str, profile: str, online: bool = True, groups: tuple[str, ...] = ()) -> DeviceStatus:
    return DeviceStatus(device_id=device, online=online, state="idle", profile=profile, groups=list(groups))


def test_a_group_resolves_to_its_online_devices_that_run_the_profile() -> None:
    statuses = {
        "vnni-1": _status("vnni-1", "intel-x86-vnni", groups=("lab",)),
        "gen-1": _status("gen-1", "generic-x86-64", groups=("lab",)),
        "vnni-off": _status("vnni-off", "intel-x86-vnni", online=False, groups=("lab",)),
        "pi-1": _status("pi-1", "rpi5-arm64", groups=("lab",)),
        "elsewhere": _status("elsewhere", "intel-x86-vnni"),
    }
    lab = resolve_target("lab", merge_status([], statuses), {})
    assert sorted(d.device_id for d in lab) == ["gen-1", "pi-1", "vnni-1", "vnni-off"]
    # A VNNI device runs generic bundles (it refines generic-x86-64); a generic device does not run VNNI ones.
    assert for_profile(lab, "generic-x86-64")[0] == ["gen-1", "vnni-1"]
    chosen, notes = for_profile(lab, "intel-x86-vnni")
    assert chosen == ["vnni-1"]
    assert "vnni-off is offline: not asked" in notes and any(n.startswith("gen-1 runs generic-x86-64") for n in notes)
    assert [d.device_id for d in resolve_target("elsewhere", merge_status([], statuses), {})] == ["elsewhere"]


def test_the_registry_decides_profile_and_groups_over_the_devices_report() -> None:
    record = DeviceRecord("dev", True, "idle", None, labels=enrolment_labels("rpi5-arm64", ["pis"]))
    statuses = {"dev": _status("dev", "intel-x86-vnni", groups=("lab",))}
    devices = merge_status([record], statuses)
    pis = resolve_target("pis", devices, {"pis": GroupDef("pis", devices=("dev",))})
    assert [(d.device_id, d.profile) for d in pis] == [("dev", "rpi5-arm64")]
    assert for_profile(pis, "intel-x86-vnni")[0] == []


def test_an_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(UserInputError, match="--measure-on nowhere: no device has that id"):
        resolve_target("nowhere", merge_status([], {"a": _status("a", "intel-x86-vnni")}), {})
