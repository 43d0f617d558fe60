"""What the converter asks of a generation runtime: teacher-forced logits, greedy continuations, and one timed
generation. One implementation per runtime (onnxruntime_genai.py, openvino_genai.py) and the FP32 reference in
transformers (torch_reference.py); the converter only sees this interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["GenerativeRunner", "TimedGeneration", "until_eos"]


@dataclass(frozen=True)
class TimedGeneration:
    """One generation at batch 1: `ttft_ms` from the call to the first token in hand, `tpot_ms` the mean time
    between the tokens after it (wall clock on this side of the runtime, the same definition for every runtime)."""

    ttft_ms: float
    tpot_ms: float
    tokens: int


class GenerativeRunner(Protocol):
    def logits(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), vocab] float32 logits of one prefill from an empty cache (teacher-forced)."""
        ...

    def greedy(self, ids: np.ndarray, max_new_tokens: int) -> list[int]:
        """Greedy continuation of `ids`, up to and including the first end token."""
        ...

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        """Generate exactly `new_tokens` after `ids` (end tokens ignored), timed."""
        ...

    def close(self) -> None: ...


def until_eos(tokens: list[int], eos: tuple[int, ...], limit: int) -> list[int]:
    """The first `limit` tokens, cut after the first end token (kept): how every runner reports a continuation."""
    out: list[int] = []
    for token in tokens[:limit]:
        out.append(int(token))
        if token in eos:
            break
    return out
