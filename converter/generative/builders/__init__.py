"""Building generative artifacts: each `BuildRecipe` (candidates.py) becomes a folder the runtime loads whole,
through the anchors' own builders where they fit.

recipes.py runs one recipe, by the module of its method:

| method | module |
|---|---|
| ort-builder | ort_builder.py: ONNX Runtime GenAI's model builder |
| ort-as-is | the exported GenAI folder, copied |
| ort-nbits, ort-gptq | matmul_nbits.py: ONNX Runtime's MatMulNBits quantizer (RTN, GPTQ) on a built folder |
| ov-export | openvino_export.py: the stateful IR from the Hugging Face weights |
| ov-nncf | nncf_weights.py: NNCF compress_weights on the FP32 IR |

A base is built before what starts from it; an artifact is built once per conversion, whatever number of
candidates and profiles share it. A failure is recorded with its reason, never raised: the others go on.

With `isolate` (a large model under a time budget: converter/generative/conversion.py), each build runs in a process
of its own (process.py starts child.py): it is stopped at the deadline of the budget's build share
(converter.deadline), where a build inside the converter's process could not be (the quantizers' inner loops are the
libraries' own), and its working memory goes back to the system when it ends, so the conversion holds one build's
memory at a time beside the runners it keeps open. A build that would start after the deadline is not started. Both
are recorded as cuts, with the reason, like any failed build.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgefleet.converter import deadline
from edgefleet.converter.generative.builders.process import in_own_process
from edgefleet.converter.generative.builders.recipes import BuildOrder, run_recipe
from edgefleet.converter.generative.candidates import BuildRecipe
from edgefleet.converter.generative.source import DecoderSource
from edgefleet.core.bundle.manifest import PassRecord

log = logging.getLogger(__name__)
__all__ = ["Artifact", "Builder", "build_order"]

# Cheapest first, so that the budget cuts the slowest builds: exports, then round-to-nearest passes, then the
# passes that run the model on calibration text (AWQ with scale estimation, GPTQ).
_COST = {"ort-as-is": 0, "ort-builder": 1, "ov-export": 1, "ort-nbits": 2, "ov-nncf": 2, "ort-gptq": 4}


@dataclass(frozen=True)
class Artifact:
    key: str
    folder: Path | None  # None when the build failed
    seconds: float
    passes: list[PassRecord] = field(default_factory=list)
    error: str | None = None

    @property
    def size_bytes(self) -> int:
        if self.folder is None:
            return 0
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())


class Builder:
    """Builds recipes into `work/<key>/`, each once, bases first; with `isolate`, each in its own process."""

    def __init__(
        self, source: DecoderSource, calibration: list[np.ndarray], work: Path, threads: int, *, isolate: bool = False
    ) -> None:
        self.source, self.calibration, self.work, self.threads = source, calibration, work, threads
        self.isolate = isolate
        self.built: dict[str, Artifact] = {}

    def build(self, recipe: BuildRecipe) -> Artifact:
        if recipe.key in self.built:
            return self.built[recipe.key]
        base: Artifact | None = None
        if recipe.base is not None:
            base = self.build(recipe.base)
            if base.folder is None:
                failed = Artifact(recipe.key, None, 0.0, error=f"its base {base.key} failed: {base.error}")
                self.built[recipe.key] = failed
                return failed
        out = self.work / recipe.key
        shutil.rmtree(out, ignore_errors=True)
        left = deadline.remaining()
        if left is not None and left <= 0:
            how = "not built: the time budget's share for builds was spent before it started"
            deadline.cut(recipe.key, how)
            self.built[recipe.key] = Artifact(recipe.key, None, 0.0, error=how)
            return self.built[recipe.key]
        started = time.monotonic()
        order = BuildOrder(recipe, base.folder if base else None, out, self.source, self.calibration, self.threads)
        try:
            passes = in_own_process(order, left) if self.isolate else run_recipe(order)
        except Exception as err:  # a builder's own failure, or the deadline: recorded, the other candidates go on
            log.info("building %s failed: %s", recipe.key, err, exc_info=not isinstance(err, deadline.TimeBudgetSpent))
            if isinstance(err, deadline.TimeBudgetSpent):
                deadline.cut(recipe.key, str(err))
            shutil.rmtree(out, ignore_errors=True)
            artifact = Artifact(recipe.key, None, time.monotonic() - started, error=str(err))
        else:
            inherited = base.passes if base is not None else []
            artifact = Artifact(recipe.key, out, time.monotonic() - started, [*inherited, *passes])
        self.built[recipe.key] = artifact
        return artifact


def build_order(recipes: list[BuildRecipe]) -> list[BuildRecipe]:
    """`recipes` cheapest first (a stable sort: the plan's order within a cost)."""
    return sorted(recipes, key=lambda r: _COST[r.method] + (1 if r.params.get("awq") else 0))
