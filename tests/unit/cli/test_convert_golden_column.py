"""`edgefleet convert`'s table: the "golden ≥ floor" column a user reads to know whether the rollout will pass."""

from __future__ import annotations

from edgefleet.cli.convert.command import golden_cell
from edgefleet.core.bundle.manifest import GoldenHold


def test_the_column_shows_the_figure_against_the_floor_and_a_dash_without_a_bundle() -> None:
    held = GoldenHold(agreement=0.984375, scores={"logits": 0.984375}, max_drop=0.01, floor=0.98, passed=True,
                      runtime="onnxruntime CPUExecutionProvider")  # fmt: skip
    assert golden_cell(held.model_dump(mode="json")) == "0.984 ≥ 0.980"
    failing = held.model_copy(update={"agreement": 0.96875, "passed": False})
    assert golden_cell(failing.model_dump(mode="json")) == "0.969 < 0.980"
    assert golden_cell(None) == "-"
