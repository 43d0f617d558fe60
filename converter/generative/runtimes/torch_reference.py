"""The FP32 reference: the Hugging Face model itself in transformers, on the CPU, in float32. Every candidate's
perplexity and next-token agreement, and the golden prompts' continuations, are set against it. It is never
timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.generative.quiet import quiet
from edgefleet.converter.generative.runtimes.base import TimedGeneration, until_eos
from edgefleet.converter.generative.torch_setup import import_torch

__all__ = ["TorchReference"]


class TorchReference:
    def __init__(self, model_dir: Path, threads: int, eos: tuple[int, ...]) -> None:
        self._torch = import_torch(threads)
        from transformers import AutoModelForCausalLM

        with quiet("loading the FP32 reference in transformers"):
            self._model: Any = AutoModelForCausalLM.from_pretrained(
                str(model_dir), local_files_only=True, dtype=self._torch.float32
            ).eval()
        self._eos = eos

    def logits(self, ids: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            out = self._model(input_ids=self._torch.from_numpy(np.asarray(ids, np.int64))[None])
        return out.logits[0].float().numpy()

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        prompt = self._torch.from_numpy(np.asarray(ids, np.int64))[None]
        with self._torch.inference_mode():
            out = self._model.generate(
                input_ids=prompt, attention_mask=self._torch.ones_like(prompt), do_sample=False,
                max_new_tokens=max_new_tokens, eos_token_id=list(self._eos), pad_token_id=self._eos[0],
            )  # fmt: skip
        return until_eos([int(t) for t in out[0, len(ids) :]], self._eos, max_new_tokens)

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        raise NotImplementedError("the FP32 reference is not timed")

    def close(self) -> None:
        self._model = None
