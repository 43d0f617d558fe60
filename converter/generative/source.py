"""Recognizing and describing a decoder-only language model: a Hugging Face model directory, or a model ONNX
Runtime GenAI's builder already exported (an ONNX with past key/value inputs and its `genai_config.json`).

Reads JSON, safetensors headers and the ONNX graph without its weights: no torch, no runtime. Anything the
converter cannot take is a `UserInputError` naming what is missing and what to give instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgefleet.core.errors import UserInputError

__all__ = [
    "DECODER_MODEL_TYPES",
    "OPENVINO_MODEL_TYPES",
    "DecoderSource",
    "is_generative",
    "load_decoder",
]

# Decoder-only families ONNX Runtime GenAI's model builder exports.
DECODER_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2", "gemma3_text", "granite", "olmo",
     "smollm3", "nemotron"}
)  # fmt: skip
# The OpenVINO export (builders/openvino_export.py) writes a Llama-style decoder: RoPE, RMSNorm, SiLU MLP, grouped-query
# attention, optional q/k/v biases (qwen2); other families are refused for OpenVINO targets, with this reason.
OPENVINO_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
GENERATION_CONFIG = "generation_config.json"
GENAI_CONFIG = "genai_config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000
PAST_INPUT = "past_key_values"


@dataclass(frozen=True)
class DecoderSource:
    """What `load_decoder` found: enough to plan candidates, tokenize text and describe the model."""

    path: Path  # the model directory
    kind: Literal["hf", "onnx-genai"]  # a Hugging Face directory, or an ONNX Runtime GenAI folder
    model_type: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    head_dim: int
    context_length: int
    tie_word_embeddings: bool
    num_parameters: int  # from the weights' headers (a tied embedding counts once); 0 when unknown (ONNX)
    weights_bytes: int  # on disk
    weights_dtypes: tuple[str, ...]
    tokenizer_files: tuple[str, ...]  # file names inside `path`
    eos_token_ids: tuple[int, ...]
    rope_type: str
    sha256: str  # over the files a conversion reads (config, weights, tokenizer), by name
    onnx_file: str | None = None  # onnx-genai: the decoder's file name
    arrived_precision: str = "fp32"  # onnx-genai: fp32, or int4-weights / int8-weights when it has MatMulNBits

    @property
    def grouped_query_attention(self) -> bool:
        return self.num_kv_heads < self.num_heads

    @property
    def openvino_refusal(self) -> str | None:
        """Why the OpenVINO export cannot take this model (None: it can)."""
        if self.kind != "hf":
            return (
                "the OpenVINO export needs the Hugging Face model directory (config.json, safetensors weights): "
                "an ONNX Runtime GenAI graph uses ONNX Runtime's own operators (GroupQueryAttention)"
            )
        if self.model_type not in OPENVINO_MODEL_TYPES:
            return (
                f"the OpenVINO export writes Llama-style decoders ({', '.join(sorted(OPENVINO_MODEL_TYPES))}), "
                f"not {self.model_type!r}"
            )
        if self.rope_type != "default":
            return f"the OpenVINO export implements plain RoPE, not rope_type {self.rope_type!r}"
        return None

    def describe(self) -> dict[str, object]:
        """A JSON-ready summary (`edgefleet inspect`)."""
        return {
            "path": str(self.path),
            "kind": "Hugging Face model directory" if self.kind == "hf" else "ONNX Runtime GenAI model",
            "model_type": self.model_type,
            "parameters": self.num_parameters or None,
            "weights_bytes": self.weights_bytes,
            "weights_dtypes": list(self.weights_dtypes),
            "layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "attention_heads": self.num_heads,
            "key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "context_length": self.context_length,
            "tied_embeddings": self.tie_word_embeddings,
            "tokenizer": list(self.tokenizer_files),
            "eos_token_ids": list(self.eos_token_ids),
            "precision": self.arrived_precision,
            "openvino": self.openvino_refusal or "exportable",
        }


def is_generative(path: Path) -> bool:
    """Whether `path` should take the language-model route: a directory (a Hugging Face or GenAI model folder),
    or an ONNX file with past key/value inputs. Whether it is usable is `load_decoder`'s to say."""
    if path.is_dir():
        return True
    if path.suffix != ".onnx" or not path.is_file():
        return False
    try:
        return any(name.startswith(PAST_INPUT) for name in _onnx_input_names(path))
    except UserInputError:  # not ONNX at all: the ONNX route's loader says so, with its own error
        return False


def load_decoder(path: Path) -> DecoderSource:
    """Check that `path` is a decoder-only language model the converter takes, and describe it."""
    if path.is_file() and path.suffix == ".onnx":
        return _load_genai(path.parent, path.name)
    if not path.is_dir():
        raise UserInputError(f"model {path} not found: give a Hugging Face model directory or an ONNX file")
    if (path / GENAI_CONFIG).is_file() and not (path / "config.json").is_file():
        return _load_genai(path, None)
    return _load_hf(path)


# --- Hugging Face model directories ------------------------------------------------------------------------------


def _load_hf(root: Path) -> DecoderSource:
    config_path = root / "config.json"
    if not config_path.is_file():
        raise UserInputError(
            f"{root} has no config.json: give a Hugging Face model directory (save_pretrained) or an ONNX file"
        )
    cfg = _read_json(config_path, "config")
    nested = cfg.get("text_config")
    text_cfg: dict[str, Any] = nested if isinstance(nested, dict) else {}
    model_type = str(cfg.get("model_type") or "")
    if model_type not in DECODER_MODEL_TYPES and text_cfg.get("model_type") in DECODER_MODEL_TYPES:
        model_type = str(text_cfg["model_type"])
    if model_type not in DECODER_MODEL_TYPES:
        raise UserInputError(
            f"model_type {model_type or '(none)'!r} in {config_path} is not a decoder-only language model the "
            f"converter takes; supported: {', '.join(sorted(DECODER_MODEL_TYPES))}"
        )
    hidden = _int(cfg, text_cfg, config_path, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, text_cfg, config_path, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, text_cfg, config_path, "num_key_value_heads", required=False) or heads
    if heads % kv_heads:
        raise UserInputError(f"{config_path}: num_attention_heads {heads} is not a multiple of {kv_heads} kv heads")
    head_dim = _int(cfg, text_cfg, config_path, "head_dim", required=False) or hidden // heads
    weights = _weights(root)
    params, dtypes = 0, set()
    for file in weights:
        for name, info in _safetensors_header(file).items():
            if name != "__metadata__" and isinstance(info, dict):
                dtypes.add(str(info.get("dtype")))
                params += math.prod(info.get("shape") or [1])
    tokenizer = tuple(name for name in TOKENIZER_FILES if (root / name).is_file())
    if "tokenizer.json" not in tokenizer:
        raise UserInputError(
            f"{root} has no tokenizer.json: save the tokenizer with the model (a fast tokenizer's "
            "save_pretrained writes it); ONNX Runtime GenAI and OpenVINO read that file"
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = str(rope.get("rope_type") or rope.get("type") or "default") if isinstance(rope, dict) else "default"
    return DecoderSource(
        path=root,
        kind="hf",
        model_type=model_type,
        vocab_size=_int(cfg, text_cfg, config_path, "vocab_size"),
        num_layers=_int(cfg, text_cfg, config_path, "num_hidden_layers", "n_layer"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        hidden_size=hidden,
        head_dim=head_dim,
        context_length=_int(cfg, text_cfg, config_path, "max_position_embeddings", "n_positions", required=False)
        or 2048,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", True))),
        num_parameters=params,
        weights_bytes=sum(w.stat().st_size for w in weights),
        weights_dtypes=tuple(sorted(dtypes)),
        tokenizer_files=tokenizer,
        eos_token_ids=_eos_ids(root, cfg, text_cfg),
        rope_type=rope_type,
        sha256=_digest(root, ["config.json", GENERATION_CONFIG, *[w.name for w in weights], *tokenizer]),
    )


def _weights(root: Path) -> list[Path]:
    index = root / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = _read_json(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserInputError(f"{index} has no weight_map: save the model again with save_pretrained")
        files = sorted({root / str(name) for name in weight_map.values()})
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise UserInputError(f"{index.name} names weight files missing from {root}: {', '.join(missing)}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if files:
        return files
    others = sorted(p.name for p in root.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5"})
    hint = f" (found {', '.join(others)}: save with safe_serialization=True)" if others else ""
    raise UserInputError(f"no safetensors weights in {root}: expected model.safetensors or {SAFETENSORS_INDEX}{hint}")


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: 8 bytes of little-endian length, then JSON."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            if not 0 < length <= min(MAX_HEADER_BYTES, path.stat().st_size - 8):
                raise UserInputError(f"{path} is not a safetensors file (bad header length): save the model again")
            header = json.loads(handle.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(f"{path} is not a readable safetensors file ({err}): save the model again") from err
    if not isinstance(header, dict):
        raise UserInputError(f"{path} is not a safetensors file (its header is not an object)")
    return header


def _eos_ids(root: Path, cfg: dict[str, Any], text_cfg: dict[str, Any]) -> tuple[int, ...]:
    generation = root / GENERATION_CONFIG
    sources = [_read_json(generation, "generation config")] if generation.is_file() else []
    for source in [*sources, cfg, text_cfg]:
        value = source.get("eos_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return tuple(value)
    raise UserInputError(
        f"{root}: no eos_token_id in generation_config.json or config.json; set it, or generation never stops"
    )


def _int(cfg: dict[str, Any], text_cfg: dict[str, Any], where: Path, *names: str, required: bool = True) -> int:
    for source in (cfg, text_cfg):
        for name in names:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    if required:
        raise UserInputError(f"{where} has no {' / '.join(names)}: not a complete model configuration")
    return 0


# --- ONNX Runtime GenAI folders ------------------------------------------------------------------------------------


def _load_genai(root: Path, onnx_name: str | None) -> DecoderSource:
    config_path = root / GENAI_CONFIG
    if not config_path.is_file():
        raise UserInputError(
            f"{root} has no {GENAI_CONFIG} beside the ONNX model: export it with ONNX Runtime GenAI's model builder "
            "(python -m onnxruntime_genai.models.builder), or give the Hugging Face model directory"
        )
    model = _read_json(config_path, "GenAI config").get("model")
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(model, dict) or not isinstance(decoder, dict):
        raise UserInputError(f"{config_path} has no model.decoder section: export the model again with the builder")
    name = onnx_name or str(decoder.get("filename") or "model.onnx")
    onnx_path = root / name
    if not onnx_path.is_file():
        raise UserInputError(f"{config_path} names {name}, which is not in {root}")
    inputs = _onnx_input_names(onnx_path)
    if not any(n.startswith(PAST_INPUT) for n in inputs):
        raise UserInputError(f"{onnx_path} has no past_key_values inputs: not a decoder exported with its KV cache")
    tokenizer = tuple(n for n in TOKENIZER_FILES if (root / n).is_file())
    if "tokenizer.json" not in tokenizer:
        raise UserInputError(f"{root} has no tokenizer.json beside {GENAI_CONFIG}: copy the model's tokenizer there")
    eos = model.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,) if isinstance(eos, int) else ()
    if not eos_ids:
        raise UserInputError(f"{config_path} has no model.eos_token_id: generation would never stop")
    heads = int(decoder.get("num_attention_heads") or 0)
    hidden = int(decoder.get("hidden_size") or 0)
    if not heads or not hidden or not decoder.get("num_hidden_layers") or not model.get("vocab_size"):
        raise UserInputError(f"{config_path} lacks the decoder's sizes: export the model again with the builder")
    data = [p for p in root.iterdir() if p.name.startswith(name) and p.is_file()]
    return DecoderSource(
        path=root,
        kind="onnx-genai",
        model_type=str(model.get("type") or "unknown"),
        vocab_size=int(model["vocab_size"]),
        num_layers=int(decoder["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(decoder.get("num_key_value_heads") or heads),
        hidden_size=hidden,
        head_dim=int(decoder.get("head_size") or hidden // heads),
        context_length=int(model.get("context_length") or 2048),
        tie_word_embeddings=False,
        num_parameters=0,
        weights_bytes=sum(p.stat().st_size for p in data),
        weights_dtypes=(),
        tokenizer_files=tokenizer,
        eos_token_ids=tuple(int(e) for e in eos_ids),
        rope_type="default",
        sha256=_digest(root, [GENAI_CONFIG, *sorted(p.name for p in data), *tokenizer]),
        onnx_file=name,
        arrived_precision=_arrived_precision(onnx_path),
    )


def _onnx_input_names(path: Path) -> list[str]:
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as err:  # protobuf's DecodeError and friends: not an ONNX file
        raise UserInputError(f"{path} is not an ONNX model ({err})") from err
    return [value.name for value in graph.input]


def _arrived_precision(path: Path) -> str:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    nbits = [node for node in graph.node if node.op_type == "MatMulNBits"]
    bits = {attr.i for node in nbits for attr in node.attribute if attr.name == "bits"}
    if not bits:
        return "fp32"
    return "int4-weights" if min(bits) <= 4 else "int8-weights"


# --- shared ---------------------------------------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(f"{what} {path} is not readable JSON ({err})") from err
    if not isinstance(data, dict):
        raise UserInputError(f"{what} {path} is not a JSON object")
    return data


def _digest(root: Path, names: list[str]) -> str:
    """sha256 over (name, sha256 of content) of each file that exists, in order: the source's identity."""
    from edgefleet.core.bundle.archive import sha256_file

    digest = hashlib.sha256()
    for name in dict.fromkeys(names):
        if (root / name).is_file():
            digest.update(f"{name}\0{sha256_file(root / name)}\n".encode())
    return digest.hexdigest()
