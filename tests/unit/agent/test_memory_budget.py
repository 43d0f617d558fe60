"""Memory admission across slots (agent/install/admission.py): a slot's model is admitted only if the device's set
of models fits min(the budget, measured free + what the slots hold), and a refusal says which slot needs how much,
how much is free and after which slots. The same on a real agent, with 0 blocks fetched:
tests/integration/agent/test_slots.py::test_an_over_budget_slot_is_refused_before_any_block_and_the_others_keep_serving.
"""

from __future__ import annotations

import pytest

from edgefleet.agent.install.admission import MemoryBudget, OverBudget, need_of
from edgefleet.core.bundle.manifest import FileEntry, Manifest, ResourceNeeds


def manifest(peak_mb: float | None = None, files_mb: float = 1.0) -> Manifest:
    """Only what admission reads: the measured peak per runtime, and the files' sizes."""
    resources = ResourceNeeds(peak_memory_mb={"onnxruntime/CPUExecutionProvider": peak_mb}) if peak_mb else None
    files = [FileEntry(path="model/model.onnx", size=int(files_mb * 1e6), sha256="0" * 64)]
    return Manifest.model_construct(resources=resources, files=files)


def test_a_measured_peak_counts_else_twice_the_files() -> None:
    assert need_of(manifest(peak_mb=610)).mb == 610
    stand_in = need_of(manifest(files_mb=3))
    assert stand_in.mb == pytest.approx(6) and "twice its files' size" in stand_in.basis


def test_a_set_over_the_budget_refuses_the_newcomer_with_the_reason() -> None:
    budget = MemoryBudget(2048, free_mb=lambda: 100_000)
    budget.admit("detector", manifest(peak_mb=1500))
    with pytest.raises(OverBudget) as refused:
        budget.admit("assistant", manifest(peak_mb=610))
    assert str(refused.value).startswith("assistant needs 610 MB, 548 MB free after detector (1500 MB) (budget 2048 MB")
    budget.admit("classifier", manifest(peak_mb=500))  # what fits still fits: nothing was reserved for the refused


def test_measured_free_memory_bounds_the_set_below_the_budget() -> None:
    budget = MemoryBudget(2048, free_mb=lambda: 300)
    budget.admit("detector", manifest(peak_mb=200))  # 300 free: fits
    with pytest.raises(OverBudget, match=r"assistant needs 400 MB, 300 MB free after detector \(200 MB\) "
                                         r"\(budget 2048 MB, 300 MB measured free"):  # fmt: skip
        budget.admit("assistant", manifest(peak_mb=400))


def test_a_new_version_of_a_slot_replaces_its_own_share() -> None:
    budget = MemoryBudget(1000, free_mb=lambda: 100_000)
    budget.admit("detector", manifest(peak_mb=600))
    budget.admit("detector", manifest(peak_mb=900))  # v2 of the same slot: 900 alone, not 600 + 900
    budget.hold("detector", None)  # a removed slot frees its share
    budget.admit("assistant", manifest(peak_mb=1000))


def test_a_refused_slot_is_worth_retrying_only_once_what_the_slots_hold_changed() -> None:
    budget = MemoryBudget(1000, free_mb=lambda: 100_000)
    budget.admit("detector", manifest(peak_mb=800))
    with pytest.raises(OverBudget):
        budget.admit("assistant", manifest(peak_mb=400))
    seen = budget.changes
    budget.hold("detector", manifest(peak_mb=800))  # the same again: nothing changed
    assert budget.changes == seen
    budget.hold("detector", None)  # the detector removed: the assistant may fit now
    assert budget.changes > seen
    budget.admit("assistant", manifest(peak_mb=400))
