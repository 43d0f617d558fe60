"""The trust boundary for what devices say (control/fleet/admission.py): budgets, identifier grammar, caps."""

from __future__ import annotations

import json

import pytest

from edgefleet.control.fleet.admission import Admission, AdmissionError, Limits
from edgefleet.core.messages import (
    DeviceStatus,
    DriftScore,
    Event,
    GenerationStats,
    GoldenTask,
    Hardware,
    LatencySummary,
    MessageError,
    OutputScore,
    SlotStatus,
    Telemetry,
    decode,
)


def report(**changes: object) -> Telemetry:
    fields: dict[str, object] = {
        "device_id": "d1", "seq": 1, "bundle_id": "m-1-generic-x86-64", "provider": "cpu", "window_s": 1.0,
        "requests": 1, "errors": 0, "throughput_rps": 1.0,
        "latency": LatencySummary(count=1, p50_ms=1.0, p95_ms=1.0, p99_ms=1.0), "golden_agreement": 1.0,
        "golden_max_abs_error": 0.0, "cpu_percent": 1.0, "rss_mb": 1.0,
    }  # fmt: skip
    fields.update(changes)
    return Telemetry(**fields)  # type: ignore[arg-type]


def test_a_device_within_its_budget_passes_and_a_flood_is_cut_to_the_sustained_rate() -> None:
    gate = Admission(Limits(messages_per_s=10, burst_messages=20, bytes_per_s=10_000, burst_bytes=100_000))
    assert [gate.budget("d1", 100, 0.0) for _ in range(20)] == [None] * 20, "the burst"
    assert gate.budget("d1", 100, 0.0) == "over-budget"
    assert gate.budget("d2", 100, 0.0) is None, "each device has its own budget"
    admitted = sum(gate.budget("d1", 100, (i + 1) / 1000) is None for i in range(1000))  # 1,000 in the next second
    assert 9 <= admitted <= 11, admitted
    assert gate.budget("d1", 70_000, 50.0) == "oversized"


def test_bytes_are_budgeted_too() -> None:
    gate = Admission(Limits(burst_bytes=50_000, bytes_per_s=1_000, max_message_bytes=40_000))
    assert gate.budget("d1", 30_000, 0.0) is None
    assert gate.budget("d1", 30_000, 0.0) == "over-budget"
    assert gate.budget("d1", 30_000, 20.0) is None, "refilled at 1,000 bytes a second"


def test_an_over_budget_device_raises_one_alert_a_minute() -> None:
    gate = Admission()
    assert gate.alert_due("d1", 0.0) and not gate.alert_due("d1", 30.0) and gate.alert_due("d1", 61.0)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (report(bundle_id="../../etc/passwd"), "invalid bundle id"),
        (report(bundle_id="b\nFORGED log line"), "invalid bundle id"),
        (report(golden_scores=[OutputScore(output="out\nput", rule="continuous", score=1.0, passed=True)]),
         "invalid output name"),
        (report(errors_by_kind={"x" * 200: 1}), "invalid error kind"),
        (report(errors_by_kind={f"k{i}": 1 for i in range(65)}), "65 error kinds: at most 64"),
        (report(drift=[DriftScore(name="in put", kind="input", psi=0.0, band="none", samples=1)]), "invalid drift"),
        (DeviceStatus(device_id="d1", online=True, state="idle", groups=["lab", "a/b"]), "invalid group"),
        (DeviceStatus(device_id="d1", online=True, state="idle",
                      slots=[SlotStatus(slot="default", state="idle", active_bundle="x" * 200)]),
         "invalid active bundle"),
        (DeviceStatus(device_id="d1", online=True, state="idle",
                      slots=[SlotStatus(slot="a", state="idle"), SlotStatus(slot="a", state="serving")]),
         "names a slot twice"),
        (DeviceStatus(device_id="d1", online=True, state="idle",
                      hardware=Hardware(arch="x", os="y", cpu_count=1, memory_mb=1, hostname="evil\x1b[2J")),
         "invalid hostname"),
        (Event(device_id="d1", kind="committed", bundle_id="b b"), "invalid bundle id"),
        (report(golden_task=GoldenTask(metric="mask-iou@0.5\nFORGED", computable=True)), "invalid metric"),
    ],
    ids=["path-bundle", "newline-bundle", "newline-output", "long-error-kind", "many-error-kinds", "drift-name",
         "slash-group", "long-bundle", "slot-twice", "escape-hostname", "event-bundle", "newline-metric"],
)  # fmt: skip
def test_an_identifier_that_breaks_its_grammar_refuses_the_message(message: object, reason: str) -> None:
    with pytest.raises(AdmissionError, match=reason):
        Admission().admit(message)  # type: ignore[type-var]


def test_free_text_is_cut_never_refused_and_what_is_valid_passes_unchanged() -> None:
    gate = Admission(Limits(max_text=100))
    event = gate.admit(Event(device_id="d1", kind="error", detail="x" * 200_000))
    assert len(event.detail) == 100 and event.detail.endswith("…")
    slot = SlotStatus(slot="detector", state="serving", active_bundle="m-1-generic-x86-64", refused="r" * 5000)
    status = gate.admit(DeviceStatus(device_id="d1", online=True, state="idle", last_error="e" * 5000,
                                     groups=["lab"], slots=[slot], agent_update="u" * 5000))  # fmt: skip
    assert status.last_error is not None and len(status.last_error) == 100 and status.groups == ["lab"]
    assert status.agent_update is not None and len(status.agent_update) == 100, "the agent's update words too"
    refused = status.slots[0].refused
    assert refused is not None and len(refused) == 100, "a slot's free text is cut like the status's own"
    scores = [OutputScore(output="StatefulPartitionedCall/logits:0", rule="continuous", score=0.99, passed=True,
                          detail={"sqnr_db": 40.0})]  # fmt: skip
    good = report(golden_scores=scores, drift=[DriftScore(name="input[2]", kind="input", psi=0.1, band="none",
                                                          samples=10)])  # fmt: skip
    assert gate.admit(good) == good


@pytest.mark.parametrize(
    "metric",
    [
        "argmax-agreement",
        "mask-iou@0.5",
        "mask-iou-mae@0.3",
        "mask-f1-mae@0.5",
        "ctc-char-accuracy@0",
        "top5",
        "metrics.py:f1",
    ],
)
def test_every_task_metric_the_converter_names_passes_in_a_golden_report(metric: str) -> None:
    """The task metric a device reports with its golden figures is the converter's name for it: a threshold metric
    (u2netp's mask-iou@0.5) refused every report of a device serving it, and its rollout timed out on "0 telemetry
    reports" (bench/rollout_corpus.py found it)."""
    good = report(golden_task=GoldenTask(metric=metric, computable=True, score=1.0, floor=0.95))
    assert Admission().admit(good) == good


@pytest.mark.parametrize(
    "generation",
    [
        {"tokens_per_s": float("nan")},
        {"ttft": {"count": 1, "p50_ms": float("inf"), "p95_ms": 1.0, "p99_ms": 1.0}},
        {"tpot": {"count": 1, "p50_ms": -1.0, "p95_ms": 1.0, "p99_ms": 1.0}},
        {"tokens_per_s": 1e12},
    ],
    ids=["nan-rate", "infinite-ttft", "negative-tpot", "absurd-rate"],
)
def test_token_figures_that_are_not_finite_plausible_numbers_refuse_the_report(generation: dict[str, object]) -> None:
    payload = json.loads(report().encode()) | {"generation": generation}
    with pytest.raises(MessageError, match="generation"):
        decode(Telemetry, json.dumps(payload).encode())  # Python's json writes NaN and Infinity, as an attacker may


def test_plausible_token_figures_pass_unchanged() -> None:
    generation = GenerationStats(
        streams=3, prompt_tokens=192, output_tokens=96, tokens_per_s=850.0,
        ttft=LatencySummary(count=3, p50_ms=4.0, p95_ms=6.5, p99_ms=6.5),
        tpot=LatencySummary(count=3, p50_ms=1.1, p95_ms=1.4, p99_ms=1.4),
    )  # fmt: skip
    assert Admission().admit(report(generation=generation)).generation == generation
