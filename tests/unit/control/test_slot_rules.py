"""Slots on the control plane, as pure functions (issue 33): resolution per slot, the memory a rollout's bundle
needs beside a device's other slots (planning admission), and the neighbour guardrail's verdict."""

from __future__ import annotations

from edgefleet.control.fleet.registry import resolve_desired
from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.neighbours import neighbour_breach
from edgefleet.control.rollout.memory import memory_refusal
from edgefleet.control.store import ANY_PROFILE, Deployment, DeviceRecord, TelemetryPoint
from edgefleet.core.messages import SlotStatus

MB = 1024 * 1024
DEVICE = DeviceRecord(
    "d1", True, "serving", "generic-x86-64",
    slots=(SlotStatus(slot="detector", state="serving", active_bundle="det-1"),
           SlotStatus(slot="assistant", state="serving", active_bundle="lm-1")),
)  # fmt: skip


def facts(bundle_id: str, peak_mb: float | None = None, files_mb: float = 0.0) -> BundleFacts:
    return BundleFacts(
        bundle_id=bundle_id, profile="generic-x86-64", size=int(files_mb * MB), wire_bytes=int(files_mb * MB),
        runtime="onnxruntime", peak_memory_mb={"onnxruntime/CPUExecutionProvider": peak_mb} if peak_mb else {},
        files_bytes=int(files_mb * MB),
    )  # fmt: skip


def test_each_slot_resolves_on_its_own_and_a_removal_is_a_deployment_of_its_slot() -> None:
    deployments = [
        Deployment("fleet", "*", "generic-x86-64", "det-1", "det", "1", slot="detector"),
        Deployment("group", "g", "generic-x86-64", "lm-2", "lm", "2", slot="assistant"),
        Deployment("device", "d1", "generic-x86-64", "cls-1", "cls", "1"),
        Deployment("device", "d1", ANY_PROFILE, "", "", "", slot="detector", remove=True),
    ]
    device = DeviceRecord("d1", True, "idle", "generic-x86-64")
    other = DeviceRecord("d2", True, "idle", "generic-x86-64")

    def bundle(d: DeviceRecord, slot: str) -> str | None:
        found = resolve_desired(d, deployments, {}, {"g"}, slot)
        return None if found is None else "remove" if found.remove else found.bundle_id

    assert {s: bundle(device, s) for s in ("default", "detector", "assistant")} == {
        "default": "cls-1", "detector": "remove", "assistant": "lm-2",
    }, "the device's removal of detector beats the fleet's detector; the other slots are not affected"  # fmt: skip
    assert {s: bundle(other, s) for s in ("default", "detector", "assistant")} == {
        "default": None, "detector": "det-1", "assistant": "lm-2",
    }  # fmt: skip


def test_a_bundle_that_does_not_fit_beside_the_other_slots_is_refused_with_the_devices_reason() -> None:
    known = {"det-1": facts("det-1", peak_mb=1000.0), "lm-1": facts("lm-1", peak_mb=628.0),
             "lm-2": facts("lm-2", peak_mb=610.0), "lm-3": facts("lm-3", peak_mb=1048.0)}  # fmt: skip
    # The assistant slot's new version replaces lm-1: only the detector stays beside it.
    assert memory_refusal(DEVICE, "assistant", "lm-2", 2048, known.get) is None
    assert memory_refusal(DEVICE, "assistant", "lm-3", 2048, known.get) is None, "1000 + 1048 = 2048 fits"
    known["lm-3"] = facts("lm-3", peak_mb=1049.0)
    assert memory_refusal(DEVICE, "assistant", "lm-3", 2048, known.get) == (
        "assistant needs 1049 MB, 1048 MB free after detector (budget 2048 MB)"
    )
    # A new slot joins both.
    assert memory_refusal(DEVICE, "asr", "lm-2", 2048, known.get) == (
        "asr needs 610 MB, 420 MB free after detector, assistant (budget 2048 MB)"
    )
    # A bundle without a measured peak counts its files twice, and the reason says so.
    known["old"] = facts("old", files_mb=300.0)
    why = memory_refusal(DEVICE, "asr", "old", 2048, known.get)
    assert why == (
        "asr needs 600 MB, 420 MB free after detector, assistant (budget 2048 MB); asr counted as files × 2 "
        "(no measured peak in the manifest)"
    )
    assert memory_refusal(DEVICE, "asr", "unknown", 2048, known.get) is None, "no record: the device decides"


def point(p95: float | None, ts: float = 0.0) -> TelemetryPoint:
    return TelemetryPoint("d1", None, ts, "det-1", "cpu", 1.0, 10, 0, None, p95, None, 10, None, None, 1.0, 1.0, None,
                          "detector")  # fmt: skip


def test_the_neighbour_guardrail_judges_the_other_slots_median_p95_against_its_objective() -> None:
    before, slow, fine = [point(20.0), point(22.0)], [point(41.0), point(45.0), point(20.0)], [point(25.0)] * 3
    assert neighbour_breach("detector", 30.0, before, slow, "assistant v2", min_reports=2) == (
        "slot detector p95 41 ms > objective 30 ms since assistant v2 arrived"
    )
    assert neighbour_breach("detector", 30.0, before, fine, "assistant v2") is None
    assert neighbour_breach("detector", 30.0, before, [point(41.0), point(20.0), point(20.0)], "x") is None, (
        "one slow window is not a breach: the median is"
    )
    assert neighbour_breach("detector", 30.0, [point(35.0)], slow, "x") is None, "already outside before"
    assert neighbour_breach("detector", 30.0, [], slow, "x") is None, "nothing to compare with"
    assert neighbour_breach("detector", 30.0, before, slow[:1], "x", min_reports=2) is None, "too few reports"
