"""Generation runtimes behind one interface (`GenerativeRunner`): ONNX Runtime GenAI, OpenVINO GenAI, and the FP32
reference in transformers. Each module imports its runtime only when a runner is opened."""

from __future__ import annotations

from pathlib import Path

from edgefleet.converter.generative.runtimes.base import GenerativeRunner, TimedGeneration, until_eos

__all__ = ["REFERENCE", "GenerativeRunner", "TimedGeneration", "open_runner", "until_eos"]

REFERENCE = "transformers"  # the FP32 reference's runtime name


def open_runner(
    runtime: str, model_dir: Path, threads: int, eos: tuple[int, ...], config: dict[str, str | int] | None = None
) -> GenerativeRunner:
    """A runner for `model_dir` on this host's CPU with `threads` and the runtime's properties `config`."""
    if runtime == "onnxruntime-genai":
        from edgefleet.converter.generative.runtimes.onnxruntime_genai import OrtGenAIRunner

        return OrtGenAIRunner(model_dir, threads, eos)
    if runtime == "openvino-genai":
        from edgefleet.converter.generative.runtimes.openvino_genai import OpenVINOGenAIRunner

        return OpenVINOGenAIRunner(model_dir, threads, eos, dict(config or {}))
    if runtime == REFERENCE:
        from edgefleet.converter.generative.runtimes.torch_reference import TorchReference

        return TorchReference(model_dir, threads, eos)
    raise ValueError(f"unknown generation runtime {runtime!r}")
