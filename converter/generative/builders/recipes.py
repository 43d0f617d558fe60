"""One recipe built into its folder, by the module that makes its kind of artifact (the table in __init__)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.converter.generative.candidates import BuildRecipe
from edgefleet.converter.generative.source import GENAI_CONFIG, DecoderSource
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["BuildOrder", "run_recipe"]


@dataclass(frozen=True)
class BuildOrder:
    """One build: `recipe` into `out` (from the artifact in `base` for a post-pass), what it reads and its threads.
    Built here or in a child process (process.py), which receives it whole."""

    recipe: BuildRecipe
    base: Path | None
    out: Path
    source: DecoderSource
    calibration: list[np.ndarray]
    threads: int


def run_recipe(order: BuildOrder) -> list[PassRecord]:
    """Build the order's recipe into its folder: the passes it ran."""
    recipe, base, out, source = order.recipe, order.base, order.out, order.source
    params = dict(recipe.params)
    if recipe.method == "ort-builder":
        from edgefleet.converter.generative.builders.ort_builder import build_with_builder

        return build_with_builder(source.path, out, params, order.threads)
    if recipe.method == "ort-as-is":
        return _copy_genai(source, out)
    if recipe.method in ("ort-nbits", "ort-gptq"):
        from edgefleet.converter.generative.builders.matmul_nbits import quantize_nbits

        assert base is not None
        return quantize_nbits(base, out, params, order.calibration)
    if recipe.method == "ov-export":
        from edgefleet.converter.generative.builders.openvino_export import export_openvino

        return export_openvino(source, out, str(params.get("weights", "f32")), order.threads)
    if recipe.method == "ov-nncf":
        from edgefleet.converter.generative.builders.nncf_weights import compress

        assert base is not None
        return compress(base, out, params, order.calibration)
    raise ValueError(f"unknown build method {recipe.method!r}")


def _copy_genai(source: DecoderSource, out: Path) -> list[PassRecord]:
    """An exported GenAI model as it arrived: its config, decoder file(s) and tokenizer, nothing else."""
    assert source.onnx_file is not None
    out.mkdir(parents=True)
    names = [GENAI_CONFIG, *source.tokenizer_files]
    names += [p.name for p in source.path.iterdir() if p.is_file() and p.name.startswith(source.onnx_file)]
    for name in dict.fromkeys(names):
        shutil.copyfile(source.path / name, out / name)
    return [PassRecord(name="as-exported", params={"precision": source.arrived_precision})]
