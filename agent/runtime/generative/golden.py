"""The golden check of a generative model on the device, against the floors its bundle's golden_prompts.json records
(edgefleet/core/quality/generation.py computes every figure, as the converter does):

- next-token agreement on the golden text: teacher-forced, in windows of the context length, the share of positions
  whose most likely next token is FP32's (`golden_agreement` in telemetry);
- perplexity on the same tokens, at most `max_perplexity_ratio` times FP32's;
- continuation agreement: greedy generation from each golden prompt, the share of FP32's continuation matched
  before the first difference, averaged over the prompts.

All three must hold. The greedy runs are timed too: their median time per output token is what a provider is
chosen by (agent/runtime/generative/selection.py).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass

from edgefleet.agent.runtime.generative.session import GenerationRequest, GenerationResult, GenerativeSession
from edgefleet.core.messages import GoldenTask, OutputScore
from edgefleet.core.quality.generation import (
    GoldenPrompt,
    GoldenPrompts,
    agreement,
    continuation_agreement,
    negative_log_likelihood,
    next_tokens,
    perplexity,
    windows,
)
from edgefleet.core.quality.golden import GoldenResult

log = logging.getLogger(__name__)

RULE = "generative golden prompts (next-token agreement, perplexity, continuation agreement)"


@dataclass(frozen=True)
class GoldenVerdict:
    result: GoldenResult
    tpot_ms: float | None  # median time per output token of the greedy runs on the golden prompts
    ttft_ms: float | None


def _finite(figures: dict[str, float]) -> dict[str, float]:
    """The figures a report can carry: an infinite perplexity is left out (its score, 0, and the reason say it)."""
    return {name: value for name, value in figures.items() if math.isfinite(value)}


def continuation_request(prompt: GoldenPrompt, context_length: int, stop_ids: frozenset[int]) -> GenerationRequest:
    """Greedy, as long as FP32's continuation (within the context), stopping where the model would."""
    budget = max(1, min(len(prompt.reference_ids), context_length - len(prompt.ids)))
    return GenerationRequest(tuple(prompt.ids), budget, stop_ids)


def judge(
    session: GenerativeSession, golden: GoldenPrompts, context_length: int, stop_ids: frozenset[int]
) -> GoldenVerdict:
    """Run the golden check; a runtime failure is a failed check, never an exception."""
    try:
        return _judge(session, golden, context_length, stop_ids)
    except Exception as err:  # a runtime failure on the golden prompts is a failed check, not a crash
        log.warning("generation failed on the golden prompts: %s", err)
        result = GoldenResult(0.0, float("inf"), False, f"generation failed on the golden prompts: {err}", rule=RULE)
        return GoldenVerdict(result, None, None)


def _judge(
    session: GenerativeSession, golden: GoldenPrompts, context_length: int, stop_ids: frozenset[int]
) -> GoldenVerdict:
    total_nll, count, predicted = 0.0, 0, []
    for window in windows(golden.text.ids, context_length):
        logits = session.logits(window.tolist())
        nll, n = negative_log_likelihood(logits, window)
        total_nll, count = total_nll + nll, count + n
        predicted.extend(next_tokens(logits).tolist())
    reference = golden.text.reference_next
    next_agreement = agreement(predicted[: len(reference)], reference) if len(predicted) >= len(reference) else 0.0
    ppl = perplexity(total_nll, count)
    if not math.isfinite(ppl):  # damaged weights can give NaN logits: a perplexity past every bar, never a crash
        ppl = math.inf
    ratio = ppl / golden.text.reference_perplexity
    runs: list[GenerationResult] = []
    continuation = []
    for prompt in golden.prompts:
        run = session.generate(continuation_request(prompt, context_length, stop_ids), _ignore)
        runs.append(run)
        continuation.append(continuation_agreement(list(run.tokens), prompt.reference_ids))
    cont = statistics.fmean(continuation)
    checks = [
        ("next-token agreement", next_agreement >= golden.min_next_token_agreement,
         f"next-token agreement {next_agreement:.4f} (floor {golden.min_next_token_agreement:.4f})"),
        ("perplexity", ratio <= golden.max_perplexity_ratio,
         f"perplexity {ppl:.3f} = {ratio:.4f}× FP32's {golden.text.reference_perplexity:.3f} "
         f"(at most {golden.max_perplexity_ratio:.4f}×)"),
        ("continuation agreement", cont >= golden.min_continuation_agreement,
         f"continuation agreement {cont:.4f} over {len(golden.prompts)} prompts "
         f"(floor {golden.min_continuation_agreement:.4f})"),
    ]  # fmt: skip
    passed = all(ok for _, ok, _ in checks)
    if passed:
        reason = "golden prompts pass: " + ", ".join(text for _, _, text in checks)
    else:
        reason = "golden prompts fail: " + "; ".join(text for _, ok, text in checks if not ok)
    scores = (
        OutputScore(output="next-token", rule="position-agreement", score=next_agreement, passed=checks[0][1],
                    detail={"floor": golden.min_next_token_agreement, "positions": float(len(reference))}),
        OutputScore(output="perplexity", rule="continuous", score=min(1.0, 1.0 / ratio), passed=checks[1][1],
                    detail=_finite({"perplexity": ppl, "reference_perplexity": golden.text.reference_perplexity,
                                    "ratio": ratio, "max_ratio": golden.max_perplexity_ratio})),
        OutputScore(output="continuation", rule="position-agreement", score=cont, passed=checks[2][1],
                    detail={"floor": golden.min_continuation_agreement, "prompts": float(len(golden.prompts))}),
    )  # fmt: skip
    task = GoldenTask(
        metric="next-token-agreement", computable=True, score=next_agreement,
        floor=golden.min_next_token_agreement, passed=passed,
    )  # fmt: skip
    result = GoldenResult(next_agreement, 0.0, passed, reason, scores, RULE, task)
    tpots = [t for r in runs if (t := r.tpot_ms) is not None]
    return GoldenVerdict(
        result, statistics.median(tpots) if tpots else None, statistics.median(r.ttft_ms for r in runs)
    )


def _ignore(_piece: str) -> None:
    return None


__all__ = ["RULE", "GoldenVerdict", "continuation_request", "judge"]
