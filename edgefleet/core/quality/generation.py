"""Judging a generative model against its FP32 reference: the figures both the converter and the device compute.

- **Perplexity** on held-out text: exp of the mean negative log-likelihood of each next token (teacher-forced).
- **Next-token agreement**: at each position of the same text, the share where the candidate's most likely next
  token is FP32's. Teacher-forced, so one early difference does not cascade.
- **Continuation agreement**: greedy generation from a golden prompt, the share of FP32's continuation matched
  before the first difference (what a user sees; a device without logits still computes it).

`GoldenPrompts` is the bundle's `golden_prompts.json`: prompts with FP32's greedy continuations and a golden
text with FP32's next tokens and perplexity. Pure numpy; no runtime is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefleet.core.errors import BundleError

MAX_GOLDEN_BYTES = 4 * 2**20  # a golden prompts file larger than this is refused unread


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GoldenPrompt(_Frozen):
    text: str = Field(max_length=8192)
    ids: list[int] = Field(min_length=1, max_length=4096, description="the prompt's token ids")
    reference_ids: list[int] = Field(min_length=1, max_length=1024, description="FP32's greedy continuation")
    reference_text: str = Field(default="", max_length=16384)


class GoldenText(_Frozen):
    ids: list[int] = Field(min_length=2, max_length=65536, description="tokens of held-out text")
    reference_next: list[int] = Field(description="FP32's most likely next token after each prefix (len(ids) - 1)")
    reference_perplexity: float = Field(gt=0)


class GoldenPrompts(_Frozen):
    schema_version: int = 1
    prompts: list[GoldenPrompt] = Field(min_length=1, max_length=64)
    text: GoldenText
    min_continuation_agreement: float = Field(
        ge=0, le=1, description="the device's floor: the built bundle's own continuation agreement, less a margin"
    )
    min_next_token_agreement: float = Field(ge=0, le=1, description="the same for next-token agreement")
    max_perplexity_ratio: float = Field(ge=1, description="device perplexity / FP32's at most this")

    @classmethod
    def load(cls, path: Path) -> GoldenPrompts:
        try:
            if path.stat().st_size > MAX_GOLDEN_BYTES:
                raise BundleError(f"golden prompts {path.name} is over {MAX_GOLDEN_BYTES} bytes")
            golden = cls.model_validate_json(path.read_bytes())
        except OSError as err:
            raise BundleError(f"cannot read the golden prompts {path.name}: {err}") from err
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(map(str, first["loc"])) or "file"
            raise BundleError(f"malformed golden prompts {path.name}: {first['msg']} at {where}") from err
        if len(golden.text.reference_next) != len(golden.text.ids) - 1:
            raise BundleError(f"golden prompts {path.name}: reference_next must hold one token per position")
        return golden

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(), separators=(",", ":")))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def negative_log_likelihood(logits: np.ndarray, ids: np.ndarray) -> tuple[float, int]:
    """Sum of -log p(ids[i+1] | ids[:i+1]) over a window whose logits are [len(ids), vocab]; and the count."""
    if logits.ndim == 3:
        logits = logits[0]
    if len(ids) < 2:
        return 0.0, 0
    lp = log_softmax(logits[: len(ids) - 1])
    targets = np.asarray(ids[1:], dtype=np.int64)
    return float(-lp[np.arange(len(targets)), targets].sum()), len(targets)


def perplexity(total_nll: float, count: int) -> float:
    return float(np.exp(total_nll / count)) if count else float("inf")


def next_tokens(logits: np.ndarray) -> np.ndarray:
    """The most likely next token at each position of [positions, vocab] (or [1, positions, vocab]) logits."""
    if logits.ndim == 3:
        logits = logits[0]
    return np.asarray(logits.argmax(axis=-1), dtype=np.int64)


def agreement(produced: np.ndarray | list[int], reference: np.ndarray | list[int]) -> float:
    """Share of positions where two token sequences of the same length agree."""
    a, b = np.asarray(produced), np.asarray(reference)
    if a.shape != b.shape or not len(b):
        raise ValueError(f"cannot compare {a.shape} tokens with {b.shape}")
    return float((a == b).mean())


def continuation_agreement(produced: list[int], reference: list[int]) -> float:
    """Share of the reference continuation matched before the first difference (a shorter answer, e.g. one that
    stopped at an end token the reference did not, counts as different from there on)."""
    matched = 0
    for got, want in zip(produced, reference, strict=False):
        if got != want:
            break
        matched += 1
    return matched / len(reference)


def windows(ids: list[int] | np.ndarray, context: int) -> list[np.ndarray]:
    """Non-overlapping windows of at most `context` tokens (the last may be shorter), for teacher-forced scoring."""
    arr = np.asarray(ids, dtype=np.int64)
    return [arr[i : i + context] for i in range(0, len(arr), context) if len(arr[i : i + context]) >= 2]


__all__ = [
    "GoldenPrompt",
    "GoldenPrompts",
    "GoldenText",
    "agreement",
    "continuation_agreement",
    "negative_log_likelihood",
    "next_tokens",
    "perplexity",
    "windows",
]
