"""What a generative bundle adds to its manifest: the runtime folder, the tokenizer, how quality and token latency
were judged at build, and the golden prompts the device re-runs before it commits.

A generative bundle (format `onnx-genai` or `openvino-genai`) is a folder the runtime loads whole (ONNX Runtime
GenAI's `genai_config.json` with `model.onnx` and its external data; OpenVINO GenAI's `openvino_model.xml` with
its tokenizer models), plus `golden_prompts.json`. Every file of that folder is in the manifest's `files`, and the
device loads the folder only when it holds nothing else (agent/install/signed_files.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GenerativeQuality(_Frozen):
    """The candidate against FP32 on held-out text: perplexity (ratio to FP32's) and next-token agreement
    (teacher-forced: at each position, the candidate's most likely next token is FP32's)."""

    perplexity: float = Field(gt=0, description="the bundle's token-level perplexity on the held-out text")
    reference_perplexity: float = Field(gt=0, description="FP32's on the same tokens")
    max_perplexity_ratio: float = Field(ge=1, description="the bar: perplexity / FP32's at most this")
    next_token_agreement: float = Field(ge=0, le=1, description="share of positions whose argmax is FP32's")
    min_next_token_agreement: float = Field(ge=0, le=1, description="the bar on next-token agreement")
    tokens: int = Field(ge=1, description="held-out tokens judged")

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity / self.reference_perplexity

    @property
    def passed(self) -> bool:
        return (
            self.perplexity_ratio <= self.max_perplexity_ratio
            and self.next_token_agreement >= self.min_next_token_agreement
        )


class TokenLatency(_Frozen):
    """Generation timed at batch 1: time to first token for a prompt, then time per output token."""

    ttft_ms: float = Field(ge=0, description="median time to the first token for `prompt_tokens` of prompt")
    tpot_ms: float = Field(gt=0, description="median time per output token after the first")
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1, description="tokens generated per timed run")
    runtime: str
    provider: str
    threads: int
    machine: str = Field(description="where it was measured")

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.tpot_ms


class BandwidthLimit(_Frozen):
    """How close generation runs to this machine's limit: at batch 1 every output token reads every weight once,
    so tokens/s cannot pass the measured read bandwidth ÷ the weights' bytes."""

    weights_bytes: int = Field(ge=1, description="bytes of weights read per generated token")
    bandwidth_gb_s: float = Field(gt=0, description="the machine's measured read bandwidth at the profile's threads")
    limit_tokens_per_s: float = Field(gt=0, description="bandwidth ÷ weights bytes")
    achieved_tokens_per_s: float = Field(ge=0)

    @property
    def share(self) -> float:
        return self.achieved_tokens_per_s / self.limit_tokens_per_s


class GenerationSpec(_Frozen):
    model_dir: str = Field(description="the folder the generative runtime loads, relative to the bundle root")
    runtime: str = Field(description="onnxruntime-genai or openvino-genai")
    tokenizer_files: list[str] = Field(description="bundle paths of the tokenizer's files")
    eos_token_ids: list[int] = Field(description="tokens that end a generation")
    vocab_size: int = Field(ge=1)
    context_length: int = Field(ge=1, description="prompt + generated tokens at most")
    max_new_tokens: int = Field(ge=1, description="a request's default token budget")
    runtime_config: dict[str, str | int] = Field(
        default_factory=dict,
        description="properties the runtime was judged and timed with, which the device applies too (OpenVINO: "
        "INFERENCE_PRECISION_HINT, KV_CACHE_PRECISION, DYNAMIC_QUANTIZATION_GROUP_SIZE; on this CPU its defaults "
        "are bf16 compute, a u8 KV cache and int8 activations)",
    )
    golden: str = Field(default="golden_prompts.json", description="bundle path of the golden prompts")
    quality: GenerativeQuality
    token_latency: TokenLatency | None = None
    limit: BandwidthLimit | None = None
