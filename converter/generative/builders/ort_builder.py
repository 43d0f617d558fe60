"""ONNX Runtime GenAI's model builder (`onnxruntime_genai.models.builder`) on a Hugging Face model directory: a
folder with model.onnx, its external data, genai_config.json and the tokenizer files, ready for og.Model.

The Python API needs `parse_extra_options` before `create_model` (it reads the Hugging Face config and tokenizer).
Extra options use 0.18's names (`algo_config`, `block_size`, `accuracy_level`); `--help` of 0.18 crashes, its
options are in builder.py's get_args().
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.converter.generative.quiet import quiet
from edgefleet.converter.generative.torch_setup import import_torch
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["EXTRA_OPTIONS", "build_with_builder"]

EXTRA_OPTIONS = ("algo_config", "block_size", "accuracy_level", "is_symmetric", "matmul_mixed_precision")


def build_with_builder(
    hf_dir: Path, out: Path, params: dict[str, str | int | float | bool], threads: int
) -> list[PassRecord]:
    """Run the builder with `params` (precision, execution_provider and extra options); the passes it made."""
    import_torch(threads)  # the builder loads the weights with transformers: passive OpenMP threads first
    precision, provider = str(params["precision"]), str(params["execution_provider"])
    extra = [f"{k}={_option(params[k])}" for k in EXTRA_OPTIONS if k in params]
    cache = out.parent / f".{out.name}-cache"
    with quiet(f"the ONNX Runtime GenAI model builder ({precision}, {provider})"):
        from onnxruntime_genai.models.builder import create_model, parse_extra_options

        options = parse_extra_options(None, str(hf_dir), str(out), precision, provider, str(cache), extra)
        create_model(None, str(hf_dir), str(out), precision, provider, str(cache), **options)
    _remove_tree(cache)
    return [
        PassRecord(
            name="onnxruntime-genai-builder",
            params={
                "precision": precision,
                "execution_provider": provider,
                **{k: params[k] for k in EXTRA_OPTIONS if k in params},
            },
        )
    ]


def _option(value: str | int | float | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
