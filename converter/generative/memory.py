"""What a candidate holds in memory while it generates: its weights, and its KV cache at the model's context length.

The KV cache keeps, for every layer, a key and a value vector per KV head per token: 2 x layers x KV heads x head
dimension elements a token. Their size is the runtime's: ONNX Runtime GenAI keeps them in the model's own I/O type
(float32 on the CPU, float16 for an FP16 model); OpenVINO GenAI in its `KV_CACHE_PRECISION` (f32 4 bytes, f16/bf16 2,
u8 1, plus a float32 scale and zero point per head vector; where none is set, f32 on a CPU and f16 on a GPU or
NPU). The weights are the artifact's bytes. Activations and the runtime's own buffers come on top, not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.converter.generative.candidates import CandidateSpec
from edgefleet.converter.generative.source import DecoderSource

__all__ = ["Memory", "memory_at_context"]

_ELEMENT = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1}
_U8_GROUP_EXTRA = 8  # a float32 scale and zero point per head vector


@dataclass(frozen=True)
class Memory:
    context_tokens: int
    kv_precision: str
    kv_cache_bytes: int
    weights_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kv_cache_bytes + self.weights_bytes

    def as_row(self) -> dict[str, object]:
        return {
            "context_tokens": self.context_tokens,
            "kv_cache_precision": self.kv_precision,
            "kv_cache_mb_at_context": round(self.kv_cache_bytes / 1e6, 1),
            "memory_mb_at_context": round(self.total_bytes / 1e6, 1),
        }

    def summary(self) -> str:
        return (
            f"memory at the model's context of {self.context_tokens} tokens: weights {self.weights_bytes / 1e6:.1f} MB"
            f" + KV cache {self.kv_cache_bytes / 1e6:.1f} MB ({self.kv_precision}) = {self.total_bytes / 1e6:.1f} MB"
        )


def memory_at_context(source: DecoderSource, spec: CandidateSpec, weights_bytes: int) -> Memory:
    """`spec`'s weights and KV cache at `source`'s full context length."""
    precision = _kv_precision(spec)
    vectors = 2 * source.num_layers * source.num_kv_heads * source.context_length
    per_vector = source.head_dim * _ELEMENT[precision] + (_U8_GROUP_EXTRA if precision == "u8" else 0)
    return Memory(source.context_length, precision, vectors * per_vector, weights_bytes)


def _kv_precision(spec: CandidateSpec) -> str:
    if spec.runtime == "onnxruntime-genai":
        return "f16" if spec.precision == "fp16" else "f32"
    given = str(spec.runtime_config.get("KV_CACHE_PRECISION", "")).lower()
    if given in _ELEMENT:
        return given
    # Every CPU candidate sets it (candidates.py); without it, f32 on a CPU (the largest it can be) and a GPU/NPU's f16.
    return "f32" if spec.device == "CPU" else "f16"
