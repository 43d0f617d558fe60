"""The bundle's golden prompts (golden_prompts.json, edgefleet.core.quality.generation.GoldenPrompts): what the
device re-runs before it commits a generative bundle.

- From FP32 (the reference), once per conversion: `PROMPTS` prompts of `PROMPT_TOKENS` cut from the evaluation
  text after the judged slice, each with its greedy continuation of up to `CONTINUATION_TOKENS`; and a golden text
  of up to `GOLDEN_TEXT_TOKENS` with FP32's next token at each position and its perplexity.
- The device's floors come from the chosen artifact's own figures on its own runtime here, less a margin: a device
  like this host passes, a broken model (wrong weights, a runtime computing garbage) fails.
  - next-token agreement: own − `NEXT_TOKEN_MARGIN` (0.10: ~13 of 127 positions may flip where another CPU's
    kernels round near-ties the other way);
  - continuation agreement: own − `CONTINUATION_MARGIN` (0.25: greedy text diverges for good at its first flip);
  - perplexity ratio: max(1, own × (1 + `PERPLEXITY_MARGIN`)) (5 %).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgefleet.converter.generative.runtimes import GenerativeRunner
from edgefleet.core.quality.generation import (
    GoldenPrompt,
    GoldenPrompts,
    GoldenText,
    agreement,
    continuation_agreement,
    negative_log_likelihood,
    next_tokens,
    perplexity,
)

__all__ = [
    "CONTINUATION_MARGIN",
    "NEXT_TOKEN_MARGIN",
    "PERPLEXITY_MARGIN",
    "DeviceFloors",
    "GoldenReference",
    "OwnFigures",
    "device_golden",
    "floors",
    "golden_reference",
    "own_figures",
]

PROMPTS = 4
PROMPT_TOKENS = 32
CONTINUATION_TOKENS = 16
GOLDEN_TEXT_TOKENS = 128
NEXT_TOKEN_MARGIN = 0.10
CONTINUATION_MARGIN = 0.25
PERPLEXITY_MARGIN = 0.05


@dataclass(frozen=True)
class GoldenReference:
    """FP32's side of the golden prompts, shared by every profile of a conversion."""

    prompts: list[GoldenPrompt]
    text: GoldenText


@dataclass(frozen=True)
class OwnFigures:
    """The chosen artifact's figures on the golden prompts, on its own runtime here."""

    next_token_agreement: float
    continuation_agreement: float
    perplexity_ratio: float


@dataclass(frozen=True)
class DeviceFloors:
    min_next_token_agreement: float
    min_continuation_agreement: float
    max_perplexity_ratio: float


def floors(own: OwnFigures) -> DeviceFloors:
    return DeviceFloors(
        min_next_token_agreement=round(max(0.0, own.next_token_agreement - NEXT_TOKEN_MARGIN), 4),
        min_continuation_agreement=round(max(0.0, own.continuation_agreement - CONTINUATION_MARGIN), 4),
        max_perplexity_ratio=round(max(1.0, own.perplexity_ratio * (1 + PERPLEXITY_MARGIN)), 4),
    )


def golden_reference(
    reference: GenerativeRunner, pool: np.ndarray, context: int, decode: Callable[[list[int]], str]
) -> GoldenReference:
    """FP32's prompts and golden text from `pool` (evaluation tokens the judging did not use)."""
    prompt_len = min(PROMPT_TOKENS, max(1, context // 4))
    continuation = max(1, min(CONTINUATION_TOKENS, context - prompt_len))
    text_len = min(GOLDEN_TEXT_TOKENS, context)
    stride = max(prompt_len, (len(pool) - text_len) // PROMPTS)
    prompts = []
    for index in range(PROMPTS):
        ids = pool[index * stride : index * stride + prompt_len]
        if len(ids) < prompt_len:
            break
        continued = reference.greedy(ids, continuation)
        prompts.append(GoldenPrompt(text=decode(ids.tolist()), ids=ids.tolist(), reference_ids=continued,
                                    reference_text=decode(continued)))  # fmt: skip
    ids = pool[-text_len:]  # after the prompts when the pool holds both
    logits = reference.logits(ids)
    nll, count = negative_log_likelihood(logits, ids)
    text = GoldenText(ids=ids.tolist(), reference_next=next_tokens(logits)[: len(ids) - 1].tolist(),
                      reference_perplexity=perplexity(nll, count))  # fmt: skip
    return GoldenReference(prompts, text)


def own_figures(runner: GenerativeRunner, golden: GoldenReference) -> OwnFigures:
    ids = np.asarray(golden.text.ids, np.int64)
    logits = runner.logits(ids)
    nll, count = negative_log_likelihood(logits, ids)
    continuations = [
        continuation_agreement(runner.greedy(np.asarray(p.ids, np.int64), len(p.reference_ids)), p.reference_ids)
        for p in golden.prompts
    ]
    return OwnFigures(
        next_token_agreement=agreement(next_tokens(logits)[: len(ids) - 1], golden.text.reference_next),
        continuation_agreement=float(np.mean(continuations)) if continuations else 1.0,
        perplexity_ratio=perplexity(nll, count) / golden.text.reference_perplexity,
    )


def device_golden(runner: GenerativeRunner, golden: GoldenReference) -> tuple[GoldenPrompts, OwnFigures]:
    """The golden prompts file for the artifact `runner` runs, its floors set from its own figures."""
    own = own_figures(runner, golden)
    bars = floors(own)
    document = GoldenPrompts(
        prompts=golden.prompts, text=golden.text, min_continuation_agreement=bars.min_continuation_agreement,
        min_next_token_agreement=bars.min_next_token_agreement, max_perplexity_ratio=bars.max_perplexity_ratio,
    )  # fmt: skip
    return document, own
