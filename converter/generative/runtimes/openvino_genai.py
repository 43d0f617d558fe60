"""OpenVINO GenAI (`openvino_genai.LLMPipeline`) on a model folder: a `GenerativeRunner`.

The pipeline gets the candidate's properties (GenerationSpec.runtime_config) and the thread count. Teacher-forced
logits come from the stateful IR itself (compiled with the same properties, state reset, one prefill: the IR
returns every position's logits). Generation is timed with a streamer that stamps each token as it arrives.
A model for GPU or NPU is judged on this host's CPU with the f32 hint (its weights as built).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.generative.runtimes.base import TimedGeneration, until_eos

__all__ = ["OpenVINOGenAIRunner"]


class OpenVINOGenAIRunner:
    def __init__(self, model_dir: Path, threads: int, eos: tuple[int, ...], config: dict[str, str | int]) -> None:
        import openvino_genai as ov_genai

        self._genai = ov_genai
        self._dir = model_dir
        self._properties: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, **config}
        self._pipe: Any = ov_genai.LLMPipeline(str(model_dir), "CPU", **self._properties)
        self._request: Any = None
        self._eos = eos

    def logits(self, ids: np.ndarray) -> np.ndarray:
        if self._request is None:
            import openvino as ov

            compiled = ov.Core().compile_model(str(self._dir / "openvino_model.xml"), "CPU", self._properties)
            self._request = compiled.create_infer_request()
        count = len(ids)
        self._request.reset_state()
        self._request.infer({
            "input_ids": np.asarray(ids, np.int64)[None],
            "attention_mask": np.ones((1, count), np.int64),
            "position_ids": np.arange(count, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32),
        })  # fmt: skip
        return np.array(self._request.get_tensor("logits").data[0], dtype=np.float32)

    def _inputs(self, ids: np.ndarray) -> Any:
        import openvino as ov

        return self._genai.TokenizedInputs(
            ov.Tensor(np.asarray(ids, np.int64)[None]), ov.Tensor(np.ones((1, len(ids)), np.int64))
        )

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        config = self._genai.GenerationConfig()
        config.max_new_tokens, config.do_sample = max_new_tokens, False
        config.set_eos_token_id(self._eos[0])
        tokens = list(self._pipe.generate(self._inputs(ids), config).tokens[0])
        return until_eos(tokens, self._eos, max_new_tokens)

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        config = self._genai.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = new_tokens
        config.ignore_eos, config.do_sample = True, False
        stamps: list[float] = []
        streamer = _stamping_streamer(self._genai, stamps)
        inputs = self._inputs(ids)
        start = time.perf_counter()
        self._pipe.generate(inputs, config, streamer)
        if len(stamps) < 2:
            raise RuntimeError(f"OpenVINO GenAI streamed {len(stamps)} tokens, not {new_tokens}")
        ttft = (stamps[0] - start) * 1e3
        return TimedGeneration(ttft, (stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1), len(stamps))

    def close(self) -> None:
        self._pipe = self._request = None


def _stamping_streamer(genai: Any, stamps: list[float]) -> Any:
    """A streamer that records when each token arrives (its class derives from openvino_genai's, imported lazily)."""

    class Stamps(genai.StreamerBase):
        def write(self, token: object) -> object:
            stamps.append(time.perf_counter())
            return genai.StreamingStatus.RUNNING

        def end(self) -> None:
            return None

    return Stamps()
