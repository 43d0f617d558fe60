"""Which models can be batched, decided from the manifest alone, and the reason given when one cannot."""

from __future__ import annotations

import hashlib

import pytest

from edgefleet.agent.schedule import BatchingConfig, batch_support
from edgefleet.core.bundle.manifest import AccuracyReport, GoldenSpec, Manifest, Recipe, TensorSpec


def _manifest(inputs: list[list[int | str | None]], outputs: list[list[int | str | None]]) -> Manifest:
    return Manifest(
        bundle_id="m-1-p", model_name="m", model_version="1", profile="p", format="onnx", model_path="model/m.onnx",
        recipe=Recipe(name="fp32", precision="fp32", runtime="onnxruntime"), providers=["CPUExecutionProvider"],
        opset={"": 17}, files=[], source_sha256=hashlib.sha256().hexdigest(),
        inputs=[TensorSpec(name=f"in{i}", dtype="float32", shape=s) for i, s in enumerate(inputs)],
        outputs=[TensorSpec(name=f"out{i}", dtype="float32", shape=s) for i, s in enumerate(outputs)],
        accuracy=AccuracyReport(metric="top1", value=1, reference=1, budget=0.01, samples=1, passed=True),
        golden=GoldenSpec(count=1, max_abs_error=1e-3, min_agreement=1.0),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("inputs", "outputs", "batchable", "reason"),
    [
        ([["N", 1, 8, 8]], [["N", 10]], True, "batched along the first dimension 'N'"),
        ([["batch", 3], ["batch", 5]], [["batch"]], True, "'batch'"),
        ([[1, 1, 8, 8]], [[1, 10]], False, "batch dimension fixed at 1: input 'in0' is [1, 1, 8, 8]"),
        ([["N", 4]], [[1, 4]], False, "fixed at 1: output 'out0'"),
        ([["N", 4]], [["M", 4]], False, "first dimensions differ"),
        ([[None, 4]], [[None, 4]], False, "unnamed"),
        ([[]], [["N"]], False, "scalar"),
    ],
)
def test_a_model_is_batchable_only_when_every_tensor_shares_one_symbolic_first_dimension(
    inputs: list[list[int | str | None]], outputs: list[list[int | str | None]], batchable: bool, reason: str
) -> None:
    support = batch_support(_manifest(inputs, outputs))
    assert support.batchable is batchable
    assert reason in support.reason


def test_batching_settings_are_checked_when_given() -> None:
    with pytest.raises(ValueError, match="preferred_batch_size"):
        BatchingConfig(preferred_batch_size=1)
    with pytest.raises(ValueError, match="max_queue_delay_ms"):
        BatchingConfig(max_queue_delay_ms=-1)
