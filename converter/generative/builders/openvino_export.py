"""A stateful OpenVINO IR of a Llama-style decoder, exported from the Hugging Face weights without optimum-intel
(which cannot be installed beside transformers 5.x): the IR OpenVINO GenAI's LLMPipeline runs, with its
tokenizer and detokenizer models.

1. A plain-torch forward over the Hugging Face modules' weights, with the KV cache as explicit tensors and the
   batch reordered by `beam_idx`. Grouped-query attention is written as the Hugging Face `repeat_kv`
   (expand + reshape): OpenVINO GenAI's SDPA → PagedAttention pass matches that form; with repeat_interleave it
   silently falls back to a ~4x slower backend.
2. `openvino.convert_model`, inputs and outputs renamed as GenAI expects, dynamic shapes.
3. Made stateful (past → present), each state initialized to zeros of [batch, kv heads, 0, head dim].
4. Saved with FP32 weights (`compress_to_fp16=False`: the default would halve them), or FP16 when asked.
5. The tokenizer converted by openvino_tokenizers (with its detokenizer); config files copied.

Llama, Mistral (without its sliding window: contexts past the window are not exact) and Qwen2 (q/k/v biases) fit
this forward; DecoderSource.openvino_refusal says why any other model does not.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgefleet.converter.generative.quiet import quiet
from edgefleet.converter.generative.source import TOKENIZER_FILES, DecoderSource
from edgefleet.converter.generative.torch_setup import import_torch
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["IR", "export_openvino"]

IR = "openvino_model.xml"
COPIED = ("config.json", "generation_config.json", *TOKENIZER_FILES)


def export_openvino(source: DecoderSource, out: Path, weights: str, threads: int) -> list[PassRecord]:
    """Write the IR, the tokenizer models and the config files into `out`; `weights` "f32" or "f16"."""
    torch = import_torch(threads)
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet("the OpenVINO export"):
        hf = AutoModelForCausalLM.from_pretrained(str(source.path), local_files_only=True, dtype=torch.float32).eval()
        layers, kv_heads, head = source.num_layers, source.num_kv_heads, source.head_dim
        steps, past = 3, 2
        example = (
            torch.ones(1, steps, dtype=torch.long), torch.ones(1, past + steps, dtype=torch.long),
            torch.arange(past, past + steps)[None], torch.zeros(1, dtype=torch.int32),
            tuple(torch.zeros(1, kv_heads, past, head) for _ in range(2 * layers)),
        )  # fmt: skip
        with torch.no_grad():
            model = ov.convert_model(_decoder_module(torch, hf, source), example_input=example)
        past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        for port, name in zip(model.inputs, ["input_ids", "attention_mask", "position_ids", "beam_idx", *past_names],
                              strict=True):  # fmt: skip
            port.get_tensor().set_names({name})
        present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        for port, name in zip(model.outputs, ["logits", *present_names], strict=True):
            port.get_tensor().set_names({name})
        model.reshape({"input_ids": [-1, -1], "attention_mask": [-1, -1], "position_ids": [-1, -1], "beam_idx": [-1],
                       **{name: [-1, kv_heads, -1, head] for name in past_names}})  # fmt: skip
        apply_make_stateful_transformation(model, dict(zip(past_names, present_names, strict=True)))
        batch = ops.gather(ops.shape_of(model.input("input_ids"), output_type="i64"), ops.constant([0]),
                           ops.constant(0))  # fmt: skip
        for op in model.get_ops():
            if op.get_type_name() == "ReadValue":  # without an initializer the state's batch would be 0
                shape = ops.concat([batch, ops.constant(np.array([kv_heads, 0, head], np.int64))], 0)
                op.set_arguments([ops.broadcast(ops.constant(0.0, ov.Type.f32), shape)])
        model.validate_nodes_and_infer_types()
        out.mkdir(parents=True)
        ov.save_model(model, str(out / IR), compress_to_fp16=weights == "f16")
        from openvino_tokenizers import convert_tokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(source.path), local_files_only=True)
        encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
        ov.save_model(encoder, str(out / "openvino_tokenizer.xml"))
        ov.save_model(decoder, str(out / "openvino_detokenizer.xml"))
    for name in COPIED:
        if (source.path / name).is_file():
            shutil.copyfile(source.path / name, out / name)
    return [PassRecord(name="openvino-stateful-export", params={"weights": weights, "kv_cache": "stateful",
                                                               "attention": "sdpa (repeat_kv)"})]  # fmt: skip


def _decoder_module(torch: Any, hf: Any, source: DecoderSource) -> Any:
    """The decoder forward with explicit KV tensors over `hf`'s own modules (weights shared, not copied)."""
    config, head = hf.config, source.head_dim
    rope = getattr(config, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)
    group = source.num_heads // source.num_kv_heads
    eps = float(config.rms_norm_eps)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = hf.model, hf.lm_head
            self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head, 2).float() / head))

        @staticmethod
        def rms(x: Any, weight: Any) -> Any:
            return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

        @staticmethod
        def rotate(x: Any, cos: Any, sin: Any) -> Any:
            first, second = x[..., : head // 2], x[..., head // 2 :]
            return x * cos + torch.cat((-second, first), -1) * sin

        @staticmethod
        def repeat_kv(x: Any) -> Any:
            batch, heads, steps, dim = x.shape
            return x[:, :, None].expand(batch, heads, group, steps, dim).reshape(batch, heads * group, steps, dim)

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, beam_idx: Any, past: Any) -> Any:
            batch, steps = input_ids.shape[0], input_ids.shape[1]
            hidden = self.model.embed_tokens(input_ids)
            freqs = position_ids[..., None].float() * self.inv_freq
            angles = torch.cat((freqs, freqs), -1)
            cos, sin = angles.cos()[:, None], angles.sin()[:, None]
            cached = past[0].shape[2]
            positions = torch.arange(steps)[:, None] + cached
            allowed = (torch.arange(cached + steps)[None, :] <= positions)[None, None]
            allowed = allowed & attention_mask[:, None, None, :].bool()
            bias = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
            presents = []
            for index, layer in enumerate(self.model.layers):
                attn = layer.self_attn
                x = self.rms(hidden, layer.input_layernorm.weight)
                q = attn.q_proj(x).view(batch, steps, -1, head).transpose(1, 2)
                k = attn.k_proj(x).view(batch, steps, -1, head).transpose(1, 2)
                v = attn.v_proj(x).view(batch, steps, -1, head).transpose(1, 2)
                q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
                k = torch.cat((past[2 * index].index_select(0, beam_idx), k), 2)
                v = torch.cat((past[2 * index + 1].index_select(0, beam_idx), v), 2)
                presents += [k, v]
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, self.repeat_kv(k), self.repeat_kv(v), attn_mask=bias
                )
                hidden = hidden + attn.o_proj(o.transpose(1, 2).reshape(batch, steps, -1))
                x = self.rms(hidden, layer.post_attention_layernorm.weight)
                mlp = layer.mlp
                hidden = hidden + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
            return (self.lm_head(self.rms(hidden, self.model.norm.weight)), *presents)

    return Decoder()
