"""Check a Hugging Face decoder model directory, and the FP32 torch reference for it.

``load_model_dir(path)`` reads only JSON and file headers (no torch): it says whether a directory is a decoder-only
language model the converter can take (``config.json`` with a supported ``model_type``, safetensors weights, a
tokenizer, an end-of-sequence id) and describes it, or raises ``ValueError`` naming what is missing.

``perplexity(model_dir, text)`` and ``next_tokens(model_dir, text)`` run the model with transformers on the CPU, in
FP32, over non-overlapping windows of ``context`` tokens: the reference a converted model is measured against.
Nothing is downloaded (``local_files_only=True``).
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Decoder-only families the converter's back ends (onnxruntime-genai's model builder, OpenVINO) know.
DECODER_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "phi",
        "phi3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "olmo",
        "smollm3",
        "nemotron",
    }
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


@dataclass(frozen=True)
class ModelDir:
    """What ``load_model_dir`` found."""

    path: Path
    model_type: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    head_dim: int
    intermediate_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    weights_files: tuple[str, ...]
    weights_bytes: int  # on disk, all safetensors files together
    num_parameters: int  # from the safetensors headers; a tied embedding counts once
    weights_dtypes: tuple[str, ...]  # safetensors dtype names, e.g. ("F32",)
    tokenizer_files: tuple[str, ...]
    eos_token_ids: tuple[int, ...]

    @property
    def grouped_query_attention(self) -> bool:
        return self.num_kv_heads < self.num_heads


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} {path} cannot be read as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} is not a JSON object")
    return data


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError(f"{path.name} is not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000 or n > path.stat().st_size - 8:
                raise ValueError(f"{path.name} is not a safetensors file (bad header length {n})")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name} is not a safetensors file: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} is not a safetensors file (header is not an object)")
    return header


def _weights(root: Path) -> list[Path]:
    index = root / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = _read_json(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = sorted({root / str(name) for name in weight_map.values()})
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise ValueError(f"{index.name} names weight files that are not in {root}: {', '.join(missing)}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if files:
        return files
    others = sorted(p.name for p in root.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5"})
    hint = f" (found {', '.join(others)}; convert them to safetensors first)" if others else ""
    raise ValueError(f"no safetensors weights in {root}: expected model.safetensors or {SAFETENSORS_INDEX}{hint}")


def _int_field(cfg: dict[str, Any], text_cfg: dict[str, Any], *names: str, required: bool = True) -> int | None:
    for source in (cfg, text_cfg):
        for name in names:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    if required:
        raise ValueError(f"config.json has no {' / '.join(names)}")
    return None


def _eos_ids(root: Path, cfg: dict[str, Any], text_cfg: dict[str, Any]) -> tuple[int, ...]:
    sources = []
    gen = root / "generation_config.json"
    if gen.is_file():
        sources.append(_read_json(gen, "generation config"))
    sources += [cfg, text_cfg]
    for source in sources:
        value = source.get("eos_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return tuple(value)
    raise ValueError("no eos_token_id in generation_config.json or config.json: generation would never stop")


def load_model_dir(path: str | Path) -> ModelDir:
    """Check that ``path`` is a Hugging Face decoder-only model directory the converter can take, and describe it.

    Raises ``ValueError`` naming the first thing missing or wrong.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"model directory {root} does not exist or is not a directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{root} has no config.json: not a Hugging Face model directory")
    cfg = _read_json(config_path, "config")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"{config_path} has no model_type")
    text_cfg = cfg.get("text_config")
    if not isinstance(text_cfg, dict):
        text_cfg = {}
    if model_type not in DECODER_MODEL_TYPES and text_cfg.get("model_type") in DECODER_MODEL_TYPES:
        model_type = str(text_cfg["model_type"])
    if model_type not in DECODER_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} in {config_path} is not a supported decoder-only language model "
            f"(supported: {', '.join(sorted(DECODER_MODEL_TYPES))})"
        )

    hidden = _int_field(cfg, text_cfg, "hidden_size", "n_embd", "d_model")
    heads = _int_field(cfg, text_cfg, "num_attention_heads", "n_head")
    assert hidden is not None and heads is not None
    kv_heads = _int_field(cfg, text_cfg, "num_key_value_heads", required=False) or heads
    head_dim = _int_field(cfg, text_cfg, "head_dim", required=False) or hidden // heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    layers = _int_field(cfg, text_cfg, "num_hidden_layers", "n_layer")
    vocab = _int_field(cfg, text_cfg, "vocab_size")
    assert layers is not None and vocab is not None

    weights = _weights(root)
    n_params = 0
    dtypes: set[str] = set()
    for w in weights:
        for name, info in _safetensors_header(w).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            dtypes.add(str(info.get("dtype")))
            n_params += math.prod(info.get("shape") or [1])

    tokenizer_files = tuple(name for name in TOKENIZER_FILES if (root / name).is_file())
    if not {"tokenizer.json", "tokenizer.model"} & set(tokenizer_files):
        raise ValueError(f"{root} has no tokenizer: expected tokenizer.json (or a sentencepiece tokenizer.model)")

    tie = cfg.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", True))
    return ModelDir(
        path=root,
        model_type=model_type,
        vocab_size=vocab,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        hidden_size=hidden,
        head_dim=head_dim,
        intermediate_size=_int_field(cfg, text_cfg, "intermediate_size", required=False),
        max_position_embeddings=_int_field(cfg, text_cfg, "max_position_embeddings", required=False),
        tie_word_embeddings=bool(tie),
        weights_files=tuple(w.name for w in weights),
        weights_bytes=sum(w.stat().st_size for w in weights),
        num_parameters=n_params,
        weights_dtypes=tuple(sorted(dtypes)),
        tokenizer_files=tokenizer_files,
        eos_token_ids=_eos_ids(root, cfg, text_cfg),
    )


# --- the FP32 torch reference -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_model_dir(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def encode(model_dir: str | Path, text: str) -> list[int]:
    """The token ids of ``text`` (no special tokens added): the positions ``next_tokens`` and ``perplexity`` use."""
    _, tokenizer = _load(str(Path(model_dir).resolve()))
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _windows(ids: list[int], context: int) -> list[list[int]]:
    if context < 2:
        raise ValueError(f"context must be at least 2, not {context}")
    return [ids[i : i + context] for i in range(0, len(ids), context)]


def _window_logits(model_dir: str | Path, text: str, context: int) -> tuple[list[list[int]], list[Any]]:
    import torch

    model, _ = _load(str(Path(model_dir).resolve()))
    windows = _windows(encode(model_dir, text), context)
    logits = []
    with torch.inference_mode():
        for w in windows:
            logits.append(model(input_ids=torch.tensor([w])).logits[0].float())
    return windows, logits


def perplexity(model_dir: str | Path, text: str, context: int = 128) -> float:
    """Token-level perplexity of ``text`` over non-overlapping windows of ``context`` tokens.

    Each window starts fresh (no carried-over state), so its first token is not predicted: the mean is over
    ``len(window) - 1`` predictions per window.
    """
    import torch

    windows, logits = _window_logits(model_dir, text, context)
    nll = 0.0
    count = 0
    for w, lg in zip(windows, logits, strict=True):
        if len(w) < 2:
            continue
        target = torch.tensor(w[1:])
        nll += float(torch.nn.functional.cross_entropy(lg[:-1], target, reduction="sum"))
        count += len(w) - 1
    if count == 0:
        raise ValueError("text too short: needs at least two tokens")
    return math.exp(nll / count)


def next_tokens(model_dir: str | Path, text: str, context: int = 128) -> list[int]:
    """The argmax next-token id at every position of ``encode(model_dir, text)``, windowed like ``perplexity``.

    ``result[i]`` is the model's greedy prediction for token ``i + 1`` given the tokens from the start of ``i``'s
    window up to ``i``; the list is as long as the token ids.
    """
    _, logits = _window_logits(model_dir, text, context)
    out: list[int] = []
    for lg in logits:
        out.extend(int(t) for t in lg.argmax(dim=-1).tolist())
    return out


def main() -> None:
    import argparse
    import os

    # Before torch loads OpenMP: on a busy machine spinning OpenMP threads make torch several times slower.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    parser = argparse.ArgumentParser(description="Check a model directory; optionally measure its perplexity.")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--text", type=Path, help="a UTF-8 text file, e.g. models/tinylm/heldout.txt")
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    try:
        info = load_model_dir(args.model_dir)
    except ValueError as exc:
        raise SystemExit(f"not usable: {exc}") from None
    for field, value in vars(info).items():
        print(f"{field}: {value}")
    if args.text:
        text = args.text.read_text(encoding="utf-8")
        n = len(encode(args.model_dir, text))
        ppl = perplexity(args.model_dir, text, args.context)
        print(f"perplexity: {ppl:.4f} ({n} tokens, windows of {args.context})")


if __name__ == "__main__":
    main()
