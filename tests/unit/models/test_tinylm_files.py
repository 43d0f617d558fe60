"""The committed tinylm model directory (models/tinylm/): its files and their key facts, read as JSON (no torch)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

TINYLM = Path(__file__).resolve().parents[3] / "models" / "tinylm"
MODEL = TINYLM / "model"
EOT = "<|endoftext|>"


def _load_module() -> ModuleType:
    """models/tinylm/load.py (not a package): imported by path, once. It imports torch only inside its functions."""
    name = "tinylm_load"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TINYLM / "load.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_model_directory_has_its_files_and_stays_small() -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        assert (MODEL / name).is_file(), name
    assert sum(p.stat().st_size for p in MODEL.iterdir()) < 5_000_000
    assert (TINYLM / "heldout.txt").stat().st_size <= 200_000
    assert (TINYLM / "calib.txt").stat().st_size <= 20_000
    assert json.loads((TINYLM / "metrics.json").read_text())["heldout_perplexity"] > 1


def test_config_is_a_llama_with_grouped_query_attention() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"]
    assert cfg["hidden_act"] == "silu"
    assert cfg["tie_word_embeddings"] is True
    # INT4 block quantization (block 32) needs every MatMul input dimension to be a multiple of 32.
    assert cfg["hidden_size"] % 32 == 0 and cfg["intermediate_size"] % 32 == 0


def test_tokenizer_matches_the_config() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    tok = json.loads((MODEL / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE"
    assert tok["pre_tokenizer"]["type"] == "ByteLevel"
    vocab = tok["model"]["vocab"]
    assert len(vocab) == cfg["vocab_size"] == 1024
    eot = [t for t in tok["added_tokens"] if t["content"] == EOT]
    assert len(eot) == 1 and eot[0]["special"]
    assert eot[0]["id"] == cfg["eos_token_id"] == cfg["bos_token_id"] == cfg["pad_token_id"]
    gen = json.loads((MODEL / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"] and gen["do_sample"] is False
    tc = json.loads((MODEL / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == EOT


def test_load_model_dir_is_the_converters_own_check_of_the_committed_model() -> None:
    info = _load_module().load_model_dir(MODEL)
    assert info.model_type == "llama"
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.hidden_size, info.head_dim) == (4, 4, 2, 128, 32)
    assert info.grouped_query_attention
    assert info.vocab_size == 1024
    assert info.weights_dtypes == ("F32",)
    assert 800_000 < info.num_parameters < 1_200_000
    assert info.weights_bytes == (MODEL / "model.safetensors").stat().st_size
    assert "tokenizer.json" in info.tokenizer_files
    assert info.eos_token_ids == (0,)
