"""Building generative artifacts: each `BuildRecipe` (candidates.py) becomes a folder the runtime loads whole,
through the anchors' own builders where they fit.

| method | module |
|---|---|
| ort-builder | ort_builder.py: ONNX Runtime GenAI's model builder |
| ort-as-is | the exported GenAI folder, copied |
| ort-nbits, ort-gptq | matmul_nbits.py: ONNX Runtime's MatMulNBits quantizer (RTN, GPTQ) on a built folder |
| ov-export | openvino_export.py: the stateful IR from the Hugging Face weights |
| ov-nncf | nncf_weights.py: NNCF compress_weights on the FP32 IR |

A base is built before what starts from it; an artifact is built once per conversion, whatever number of
candidates and profiles share it. A failure is recorded with its reason, never raised: the others go on.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgefleet.converter.generative.candidates import BuildRecipe
from edgefleet.converter.generative.source import GENAI_CONFIG, DecoderSource
from edgefleet.core.bundle.manifest import PassRecord

log = logging.getLogger(__name__)
__all__ = ["Artifact", "Builder"]


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
    """Builds recipes into `work/<key>/`, each once, bases first."""

    def __init__(self, source: DecoderSource, calibration: list[np.ndarray], work: Path, threads: int) -> None:
        self.source, self.calibration, self.work, self.threads = source, calibration, work, threads
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
        started = time.monotonic()
        try:
            passes = self._run(recipe, base, out)
        except Exception as err:  # a builder's own failure: recorded, the other candidates go on
            log.info("building %s failed: %s", recipe.key, err, exc_info=True)
            shutil.rmtree(out, ignore_errors=True)
            artifact = Artifact(recipe.key, None, time.monotonic() - started, error=str(err))
        else:
            inherited = base.passes if base is not None else []
            artifact = Artifact(recipe.key, out, time.monotonic() - started, [*inherited, *passes])
        self.built[recipe.key] = artifact
        return artifact

    def _run(self, recipe: BuildRecipe, base: Artifact | None, out: Path) -> list[PassRecord]:
        params = dict(recipe.params)
        if recipe.method == "ort-builder":
            from edgefleet.converter.generative.builders.ort_builder import build_with_builder

            return build_with_builder(self.source.path, out, params, self.threads)
        if recipe.method == "ort-as-is":
            return self._copy_genai(out)
        if recipe.method in ("ort-nbits", "ort-gptq"):
            from edgefleet.converter.generative.builders.matmul_nbits import quantize_nbits

            assert base is not None and base.folder is not None
            return quantize_nbits(base.folder, out, params, self.calibration)
        if recipe.method == "ov-export":
            from edgefleet.converter.generative.builders.openvino_export import export_openvino

            return export_openvino(self.source, out, str(params.get("weights", "f32")), self.threads)
        if recipe.method == "ov-nncf":
            from edgefleet.converter.generative.builders.nncf_weights import compress

            assert base is not None and base.folder is not None
            return compress(base.folder, out, params, self.calibration)
        raise ValueError(f"unknown build method {recipe.method!r}")

    def _copy_genai(self, out: Path) -> list[PassRecord]:
        """An exported GenAI model as it arrived: its config, decoder file(s) and tokenizer, nothing else."""
        source = self.source
        assert source.onnx_file is not None
        out.mkdir(parents=True)
        names = [GENAI_CONFIG, *source.tokenizer_files]
        names += [p.name for p in source.path.iterdir() if p.is_file() and p.name.startswith(source.onnx_file)]
        for name in dict.fromkeys(names):
            shutil.copyfile(source.path / name, out / name)
        return [PassRecord(name="as-exported", params={"precision": source.arrived_precision})]
