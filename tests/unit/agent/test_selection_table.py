"""`choose` as a table: (allowed, availability, measurements, policy) → (choice, reasons)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from edgefleet.agent.runtime.backends import Availability
from edgefleet.agent.runtime.selection.selector import Measurement, NoProviderError, Policy, choose
from edgefleet.core.quality.golden import GoldenResult

OK = GoldenResult(1.0, 1e-6, True, "agreement 1.000")
BAD = GoldenResult(0.5, 0.3, False, "max |error| 0.3 exceeds the tolerance 0.001")
CPU, OVEP, OV, NPU, CUDA = "CPUExecutionProvider", "OpenVINOExecutionProvider", "openvino:CPU", "openvino:NPU", "CUDA"


def m(
    provider: str, ms: float | None = None, golden: GoldenResult | None = OK, error: str | None = None
) -> Measurement:
    return Measurement(provider, error=error, golden=golden, median_ms=ms)


@dataclass
class Row:
    name: str
    allowed: list[str]
    measured: list[Measurement]
    chosen: str
    reasons: dict[str, str]  # provider -> a fragment its reason must contain
    unavailable: dict[str, str] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)


TABLE = [
    Row("fastest wins", [CPU, OV, OVEP], [m(CPU, 0.020), m(OV, 0.010), m(OVEP, 0.015)], OV,
        {CPU: "slower: 0.02 ms median vs 0.01 ms on openvino:CPU (2.00×)", OVEP: "slower"}),
    Row("only one candidate is not timed", [CPU], [m(CPU)], CPU, {}),
    Row("unavailable ones say why", [CUDA, CPU], [m(CPU)], CPU, {CUDA: "not available: needs onnxruntime-gpu"},
        unavailable={CUDA: "needs onnxruntime-gpu"}),
    Row("outputs out of tolerance are dropped even when fastest", [CPU, OV], [m(CPU, 0.02), m(OV, 0.001, BAD)], CPU,
        {OV: "outputs leave the golden tolerance: max |error| 0.3"}),
    Row("load failures and hangs are skipped with their reason", [OV, OVEP, CPU],
        [m(OV, error="hung: took over 60 s"), m(OVEP, error="failed: no device"), m(CPU)], CPU,
        {OV: "hung", OVEP: "failed: no device"}),
    Row("a tie within the margin goes to the bundle's order", [CPU, OV], [m(CPU, 0.0102), m(OV, 0.0100)], CPU,
        {OV: "as fast within 5%"}),
    Row("outside the margin the faster one wins", [CPU, OV], [m(CPU, 0.0110), m(OV, 0.0100)], OV, {CPU: "1.10×"}),
    Row("policy prefers the NPU when it passes, even slower", [CPU, NPU], [m(CPU, 0.01), m(NPU, 0.05)], NPU,
        {CPU: "policy prefers openvino:NPU"}, policy=Policy(prefer=[NPU])),
    Row("a preferred provider that fails tolerance is not used", [CPU, NPU], [m(CPU, 0.01), m(NPU, 0.005, BAD)], CPU,
        {NPU: "golden tolerance"}, policy=Policy(prefer=[NPU])),
    Row("policy exclusion", [OV, CPU], [m(OV, 0.001), m(CPU, 0.01)], CPU, {OV: "excluded by the agent's policy"},
        policy=Policy(exclude=[OV])),
    Row("zero margin picks the strictly fastest", [CPU, OV], [m(CPU, 0.0101), m(OV, 0.0100)], OV, {CPU: "slower"},
        policy=Policy(tie_margin=0.0)),
]  # fmt: skip


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_choose(row: Row) -> None:
    availability = {p: Availability.no(row.unavailable[p]) if p in row.unavailable else Availability.yes()
                    for p in row.allowed}  # fmt: skip
    choice = choose(row.allowed, availability, {x.provider: x for x in row.measured}, row.policy)
    assert choice.provider == row.chosen
    assert set(choice.reasons) == set(row.allowed) - {row.chosen}, "every other allowed provider gets a reason"
    for provider, fragment in row.reasons.items():
        assert fragment in choice.reasons[provider], (provider, choice.reasons[provider])
    assert choice.summary


def test_nothing_usable_raises_with_every_reason() -> None:
    availability = {CUDA: Availability.no("no NVIDIA GPU"), CPU: Availability.yes()}
    with pytest.raises(NoProviderError) as caught:
        choose([CUDA, CPU], availability, {CPU: m(CPU, golden=BAD)}, Policy())
    assert "no NVIDIA GPU" in str(caught.value) and "golden tolerance" in str(caught.value)


def test_choose_is_deterministic_and_keeps_the_bundle_order_for_reasons() -> None:
    allowed = [OVEP, CPU, OV]
    availability = {p: Availability.yes() for p in allowed}
    measured = {OVEP: m(OVEP, 0.03), CPU: m(CPU, 0.01), OV: m(OV, 0.02)}
    first = choose(allowed, availability, measured, Policy())
    assert first == choose(allowed, availability, measured, Policy())
    assert list(first.reasons) == [OVEP, OV]
