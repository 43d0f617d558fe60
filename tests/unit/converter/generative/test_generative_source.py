"""Recognizing a language model: what a Hugging Face directory or a GenAI export says, and one clear error, naming
what to give instead, for everything the converter cannot take."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgefleet.converter.generative.source import is_generative, load_decoder
from edgefleet.core.errors import UserInputError

from support.paths import DIGITS, TINYLM

LLAMA = {
    "model_type": "llama", "vocab_size": 1024, "hidden_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 4, "max_position_embeddings": 256, "eos_token_id": 0,
}  # fmt: skip


def _hf_dir(root: Path, config: dict[str, object] | None = None, weights: bool = True, tokenizer: bool = True) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(LLAMA if config is None else config))
    if weights:  # a safetensors header with one tensor (no data needed to describe it)
        header = json.dumps({"w": {"dtype": "F32", "shape": [10, 20], "data_offsets": [0, 800]}}).encode()
        (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(800))
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    return root


def test_tinylm_is_described_from_its_files() -> None:
    source = load_decoder(TINYLM / "model")
    assert (source.kind, source.model_type, source.num_parameters) == ("hf", "llama", 918_656)
    assert (source.num_layers, source.hidden_size, source.num_heads, source.num_kv_heads) == (4, 128, 4, 2)
    assert (source.context_length, source.vocab_size, source.eos_token_ids) == (256, 1024, (0,))
    assert source.grouped_query_attention and source.tie_word_embeddings
    assert "tokenizer.json" in source.tokenizer_files and source.openvino_refusal is None
    assert len(source.sha256) == 64 and source.describe()["openvino"] == "exportable"


def test_directories_and_past_kv_onnx_files_take_the_language_model_route(tmp_path: Path) -> None:
    assert is_generative(TINYLM / "model") and is_generative(tmp_path)
    assert not is_generative(DIGITS / "digits_cnn.onnx")
    assert is_generative(_past_kv_onnx(tmp_path / "decoder.onnx"))


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: d.mkdir(), "has no config.json"),
        (lambda d: _hf_dir(d, {"model_type": "bert"}), "'bert' .* is not a decoder-only language model"),
        (lambda d: _hf_dir(d, weights=False), "no safetensors weights"),
        (lambda d: _hf_dir(d, tokenizer=False), "no tokenizer.json"),
        (lambda d: _hf_dir(d, {k: v for k, v in LLAMA.items() if k != "eos_token_id"}), "no eos_token_id"),
        (lambda d: _hf_dir(d, {**LLAMA, "num_key_value_heads": 3}), "not a multiple"),
    ],
)
def test_what_it_cannot_take_is_one_user_error(tmp_path: Path, make: object, fragment: str) -> None:
    folder = tmp_path / "model"
    make(folder)  # type: ignore[operator]
    with pytest.raises(UserInputError, match=fragment):
        load_decoder(folder)


def test_pytorch_bin_weights_get_a_hint(tmp_path: Path) -> None:
    folder = _hf_dir(tmp_path / "m", weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(UserInputError, match=r"pytorch_model.bin: save with safe_serialization=True"):
        load_decoder(folder)


def test_openvino_takes_llama_style_models_only(tmp_path: Path) -> None:
    qwen3 = load_decoder(_hf_dir(tmp_path / "q", {**LLAMA, "model_type": "qwen3"}))
    assert qwen3.openvino_refusal is not None and "Llama-style" in qwen3.openvino_refusal
    scaled = load_decoder(_hf_dir(tmp_path / "s", {**LLAMA, "rope_scaling": {"rope_type": "llama3"}}))
    assert scaled.openvino_refusal is not None and "llama3" in scaled.openvino_refusal


def test_an_onnx_with_past_kv_needs_its_genai_config(tmp_path: Path) -> None:
    model = _past_kv_onnx(tmp_path / "model.onnx")
    with pytest.raises(UserInputError, match=r"no genai_config\.json beside the ONNX model.*model builder"):
        load_decoder(model)


def test_a_genai_export_is_read_from_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "genai"
    folder.mkdir()
    _past_kv_onnx(folder / "model.onnx")
    shutil.copyfile(TINYLM / "model" / "tokenizer.json", folder / "tokenizer.json")
    config = {"model": {"type": "llama", "vocab_size": 1024, "context_length": 256, "eos_token_id": 0, "decoder": {
        "filename": "model.onnx", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
        "num_hidden_layers": 4, "head_size": 32}}}  # fmt: skip
    (folder / "genai_config.json").write_text(json.dumps(config))
    source = load_decoder(folder)
    assert (source.kind, source.onnx_file, source.arrived_precision, source.context_length) == (
        "onnx-genai",
        "model.onnx",
        "fp32",
        256,
    )
    assert source.openvino_refusal is not None and "Hugging Face model directory" in source.openvino_refusal
    assert load_decoder(folder / "model.onnx").sha256 == source.sha256


def _past_kv_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["logits"])], "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["b", 2, "p", 32])],
        [helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "s"])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_file_that_is_not_onnx_is_left_to_the_onnx_route(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"\x00\x01garbage" * 50)
    assert not is_generative(bogus)
