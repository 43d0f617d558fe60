"""ONNX Runtime GenAI (`onnxruntime_genai`) on a model folder: a `GenerativeRunner`.

Threads are set as the device sets them, by overlaying `model.decoder.session_options` (the same as editing
genai_config.json). Teacher-forced logits come from `get_output("logits")` after `append_tokens`, which holds every
position of the prefill. A model built for CUDA is judged on this host's CPU provider (`clear_providers`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.generative.runtimes.base import TimedGeneration, until_eos

__all__ = ["OrtGenAIRunner"]


class OrtGenAIRunner:
    def __init__(self, model_dir: Path, threads: int, eos: tuple[int, ...]) -> None:
        import onnxruntime_genai as og

        self._og = og
        config = og.Config(str(model_dir))
        config.clear_providers()  # the CPU provider: what this host runs (a CUDA model too, for judging)
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        self._model: Any = og.Model(config)
        self._eos = eos
        self._context = int(json.loads((model_dir / "genai_config.json").read_text("utf-8"))["model"]["context_length"])

    def _generator(self, max_length: int, min_length: int = 0) -> Any:
        params = self._og.GeneratorParams(self._model)
        params.set_search_options(do_sample=False, max_length=min(max_length, self._context), min_length=min_length)
        return self._og.Generator(self._model, params)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        generator = self._generator(len(ids))
        generator.append_tokens(np.asarray(ids, np.int64))
        return np.asarray(generator.get_output("logits"), dtype=np.float32)[0]

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        generator = self._generator(len(ids) + max_new_tokens)
        generator.append_tokens(np.asarray(ids, np.int64))
        while not generator.is_done():
            generator.generate_next_token()
        return until_eos(list(generator.get_sequence(0))[len(ids) :], self._eos, max_new_tokens)

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        total = len(ids) + new_tokens
        start = time.perf_counter()
        generator = self._generator(total, min_length=total)  # never stops at an end token
        generator.append_tokens(np.asarray(ids, np.int64))  # the prefill
        generator.generate_next_token()
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            generator.generate_next_token()
        end = time.perf_counter()
        return TimedGeneration((first - start) * 1e3, (end - first) * 1e3 / max(1, new_tokens - 1), new_tokens)

    def close(self) -> None:
        self._model = None
