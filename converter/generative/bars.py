"""The quality bars a generative candidate must pass, and the timing it gets, with their defaults.

- **Perplexity ratio ≤ 1.05** (candidate ÷ FP32 on the same held-out tokens). Weight-only INT4 at group 32-128
  typically costs 1-5 % of perplexity on 1-8B models (the GPTQ and AWQ papers' WikiText-2 tables); 5 % keeps
  those and refuses a broken or badly calibrated quantization, whose perplexity rises by tens of percent. On
  models/tinylm every INT4 candidate costs at most 1.01 % (docs/converter.md).
- **Next-token agreement ≥ 0.80** (teacher-forced: at each position, the candidate's most likely next token is
  FP32's). Perplexity averages over the whole distribution; agreement says what greedy decoding will do. Good
  INT4 keeps 85-95 % of the argmaxes (tinylm: 87-93 %; INT8 and bf16 ≥ 98.8 %); below 80 % one token in five
  would differ under greedy decoding, which users notice.

A user sets their own with `--max-perplexity-ratio` and `--min-next-token-agreement`. Timing: TTFT for a
64-token prompt (a short chat turn) and TPOT over 32 output tokens, `--prompt-tokens` / `--output-tokens`.
Pure data; nothing heavy is imported (the CLI reads the defaults for its help).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_MAX_PERPLEXITY_RATIO",
    "DEFAULT_MIN_NEXT_TOKEN_AGREEMENT",
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "QualityBars",
]

DEFAULT_MAX_PERPLEXITY_RATIO = 1.05
DEFAULT_MIN_NEXT_TOKEN_AGREEMENT = 0.80
DEFAULT_PROMPT_TOKENS = 64
DEFAULT_OUTPUT_TOKENS = 32


class QualityBars(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_perplexity_ratio: float = Field(
        default=DEFAULT_MAX_PERPLEXITY_RATIO, ge=1.0, description="candidate perplexity ÷ FP32's at most this"
    )
    min_next_token_agreement: float = Field(
        default=DEFAULT_MIN_NEXT_TOKEN_AGREEMENT, ge=0.0, le=1.0, description="share of FP32's argmaxes kept"
    )

    def refusal(self, perplexity_ratio: float, agreement: float) -> str | None:
        """Why a candidate with these figures is refused (None: it passes). Both bars are named when both fail."""
        reasons = []
        if perplexity_ratio > self.max_perplexity_ratio:
            reasons.append(f"perplexity {perplexity_ratio:.4f}x FP32's is over the bar {self.max_perplexity_ratio:g}x")
        if agreement < self.min_next_token_agreement:
            reasons.append(f"next-token agreement {agreement:.4f} is under the bar {self.min_next_token_agreement:g}")
        return "; ".join(reasons) or None
