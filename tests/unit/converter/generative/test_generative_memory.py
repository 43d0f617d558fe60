"""What a candidate holds while it generates: its weights and its KV cache at the model's full context, in the
element size its runtime keeps the cache in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgefleet.converter.generative.candidates import BuildRecipe, CandidateSpec
from edgefleet.converter.generative.memory import memory_at_context
from edgefleet.converter.generative.source import DecoderSource, load_decoder

from support.models.generative import MODEL_DIR

RECIPE = BuildRecipe(key="x", method="ort-builder")


@pytest.fixture(scope="module")
def smollm2_shape() -> DecoderSource:
    """tinylm's source with SmolLM2-135M's shape: 30 layers, 3 KV heads of 64, a context of 8192."""
    return replace(load_decoder(MODEL_DIR), num_layers=30, num_kv_heads=3, head_dim=64, context_length=8192)


def _spec(runtime: str, precision: str, config: dict[str, str | int], provider: str) -> CandidateSpec:
    return CandidateSpec(
        name="c", runtime=runtime, provider=provider, precision=precision, build=RECIPE,  # type: ignore[arg-type]
        runtime_config=config, description="", order=0, measurable=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "precision", "config", "provider", "kv", "kv_mb"),
    [
        # 2 x 30 layers x 3 heads x 8192 tokens = 1,474,560 head vectors of 64 elements
        ("onnxruntime-genai", "int4-weights", {}, "onnxruntime-genai:cpu", "f32", 377.5),  # x 256 bytes
        ("onnxruntime-genai", "fp16", {}, "onnxruntime-genai:cuda", "f16", 188.7),  # x 128
        ("openvino-genai", "int8-weights", {"KV_CACHE_PRECISION": "u8"}, "openvino-genai:CPU", "u8", 106.2),  # x 72
        ("openvino-genai", "fp32", {"KV_CACHE_PRECISION": "f32"}, "openvino-genai:CPU", "f32", 377.5),
        ("openvino-genai", "fp16", {"INFERENCE_PRECISION_HINT": "f16"}, "openvino-genai:GPU", "f16", 188.7),
    ],
)
def test_the_kv_cache_at_the_full_context_in_the_runtimes_element_size(
    smollm2_shape: DecoderSource, runtime: str, precision: str, config: dict[str, str | int], provider: str,
    kv: str, kv_mb: float,
) -> None:  # fmt: skip
    memory = memory_at_context(smollm2_shape, _spec(runtime, precision, config, provider), weights_bytes=110_000_000)
    assert (memory.context_tokens, memory.kv_precision) == (8192, kv)
    assert memory.as_row()["kv_cache_mb_at_context"] == kv_mb
    assert memory.as_row()["memory_mb_at_context"] == round(kv_mb + 110.0, 1)
    assert memory.summary().startswith(
        f"memory at the model's context of 8192 tokens: weights 110.0 MB + KV cache {kv_mb}"
    )
