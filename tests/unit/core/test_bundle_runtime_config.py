"""A bundle's runtime configuration is data: the allow-list of edgefleet/core/bundle/runtime_config.py, as tables.
Every key the converter writes passes; anything that loads a library, names a path, sets a provider the profile does
not allow, or is simply not on the list is refused with a reason that names the key."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from edgefleet.converter.generative.candidates import OV_BF16, OV_COMPRESSED, OV_EXACT
from edgefleet.core.bundle.runtime_config import (
    OPENVINO_GENAI,
    ORT_GENAI,
    ConfigRefused,
    check_genai_config,
    check_runtime_config,
)

# What ONNX Runtime GenAI's model builder writes for models/tinylm (the converter ships it as is).
BUILDER_CONFIG: dict[str, Any] = {
    "model": {
        "bos_token_id": 0,
        "context_length": 256,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "model.onnx",
            "head_size": 32,
            "hidden_size": 128,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                       "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
        },
        "eos_token_id": 0,
        "pad_token_id": 0,
        "type": "llama",
        "vocab_size": 1024,
    },
    "search": {"do_sample": False, "max_length": 256, "num_beams": 1, "past_present_share_buffer": True, "top_k": 50,
               "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0},
}  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "config"),
    [
        (OPENVINO_GENAI, OV_EXACT),  # the converter's three OpenVINO property sets
        (OPENVINO_GENAI, OV_COMPRESSED),
        (OPENVINO_GENAI, OV_BF16),
        (OPENVINO_GENAI, {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": "YES"}),
        (ORT_GENAI, {}),  # the converter writes none for ONNX Runtime GenAI
        (ORT_GENAI, {"intra_op_num_threads": 4, "session.intra_op.allow_spinning": "0"}),
        (ORT_GENAI, {"graph_optimization_level": "ORT_ENABLE_ALL", "log_severity_level": 3}),
        (ORT_GENAI, {"optimization.disable_specified_optimizers": "MatMulNBitsFusion", "ep.cuda.fpa_intb_gemm": "1"}),
    ],
)
def test_the_runtime_config_the_converter_writes_passes(runtime: str, config: dict[str, str | int]) -> None:
    check_runtime_config(runtime, config)


@pytest.mark.parametrize(
    ("runtime", "config", "reason"),
    [
        (ORT_GENAI, {"custom_ops_library": "/tmp/libevil.so"}, "'custom_ops_library' loads a native library"),
        (ORT_GENAI, {"custom_ops_library": "libevil.so"}, "--custom-op-libs"),
        (ORT_GENAI, {"enable_profiling": "/tmp/trace"}, "'enable_profiling' writes profiling files"),
        (ORT_GENAI, {"ep.context_file_path": "/tmp/ctx.onnx"}, "'ep.context_file_path' names a path"),
        (ORT_GENAI, {"session.load_model_format": "ORT"}, "changes how the model file is parsed"),
        (ORT_GENAI, {"some.config.entry": "1"}, "'some.config.entry' is not a key the agent passes on"),
        (ORT_GENAI, {"intra_op_num_threads": 100000}, "takes an integer from 0 to 1024"),
        (ORT_GENAI, {"session.intra_op.allow_spinning": 1}, 'takes "0" or "1"'),
        (ORT_GENAI, {"log_id": "../../x"}, "without path separators"),
        (ORT_GENAI, {"enable_cpu_mem_arena": 1}, "takes true or false"),
        (ORT_GENAI, {"optimization.disable_specified_optimizers": "../x"}, "takes comma-separated optimizer names"),
        (OPENVINO_GENAI, {"EXTENSIONS": "/tmp/libevil.so"}, "'EXTENSIONS' loads native extension libraries"),
        (OPENVINO_GENAI, {"CONFIG_FILE": "/tmp/plugins.xml"}, "loads native plugins"),
        (OPENVINO_GENAI, {"CACHE_DIR": "/tmp/cache"}, "'CACHE_DIR' names a path"),
        (OPENVINO_GENAI, {"INFERENCE_PRECISION_HINT": "f64"}, "takes one of 'f32', 'f16', 'bf16'"),
        (OPENVINO_GENAI, {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}, "takes an integer"),
        (OPENVINO_GENAI, {"DEVICE_ID": "1"}, "'DEVICE_ID' is not a key the agent passes on"),
        ("tensorrt", {"anything": 1}, "passes no runtime configuration to 'tensorrt'"),
    ],
)
def test_a_runtime_config_key_off_the_list_is_refused_with_its_reason(
    runtime: str, config: dict[str, str | int], reason: str
) -> None:
    with pytest.raises(ConfigRefused, match=r"generation\.runtime_config") as refused:
        check_runtime_config(runtime, config)
    assert reason in str(refused.value)


def test_the_model_builders_genai_config_passes_and_names_its_onnx_file() -> None:
    named = check_genai_config(json.loads(json.dumps(BUILDER_CONFIG)), ["cpu"])
    assert named.named == (("model.decoder.filename", "model.onnx"),)


def _with(path: str, value: object) -> dict[str, Any]:
    """BUILDER_CONFIG with `value` set at `path` (keys separated by '/': ORT's own keys hold dots)."""
    config = copy.deepcopy(BUILDER_CONFIG)
    *parents, last = path.split("/")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("model/decoder/session_options/custom_ops_library", "libevil.so", "'custom_ops_library' loads a native"),
        ("model/decoder/custom_ops_library", "libevil.so", "'custom_ops_library' loads a native"),
        ("model/embedding/session_options/custom_ops_library", "x.so", "'custom_ops_library' loads a native"),
        ("model/decoder/session_options/enable_profiling", "trace", "'enable_profiling' writes profiling files"),
        ("model/decoder/session_options/ep.context_file_path", "x", "'ep.context_file_path' names a path"),
        ("model/decoder/session_options/provider_options", [{"qnn": {"backend_path": "libQnnHtp.so"}}],
         "sets provider 'qnn', which the bundle's profile does not allow here (allowed: cpu)"),
        ("model/decoder/session_options/provider_options", [{"cuda": {}}], "sets provider 'cuda'"),
        ("model/decoder/session_options/provider_options", [{"cpu": {"arena": "1"}}],
         "'arena' is not a key the agent passes on"),
        ("model/decoder/run_options", {"gpu_graph_id": "1"}, "'gpu_graph_id' is not a key the agent passes on"),
        ("model/decoder/plugin", "x", "'plugin' is not a key the agent passes on"),
        ("loader", {"library": "x"}, "'loader' is not a section the agent passes on"),
        ("model/decoder/inputs/input_ids", "/opt/libevil.so", "names a native library"),
        ("model/decoder/filename", ["model.onnx"], "names a file that is not a string"),
    ],
)  # fmt: skip
def test_a_genai_config_that_loads_code_names_paths_or_other_providers_is_refused(
    path: str, value: object, reason: str
) -> None:
    with pytest.raises(ConfigRefused, match=r"genai_config\.json") as refused:
        check_genai_config(_with(path, value), ["cpu"])
    assert reason in str(refused.value)


def test_a_provider_the_bundle_lists_may_carry_its_allowed_options() -> None:
    config = _with("model/decoder/session_options/provider_options", [{"cuda": {"enable_cuda_graph": "1"}}])
    check_genai_config(config, ["cuda"])
    with pytest.raises(ConfigRefused, match="'enable_cuda_graph' takes"):
        check_genai_config(_with("model/decoder/session_options/provider_options",
                                 [{"cuda": {"enable_cuda_graph": "yes"}}]), ["cuda"])  # fmt: skip


def test_every_file_a_genai_config_names_is_returned_for_the_signed_file_check() -> None:
    config = _with("model/decoder/pipeline", [{"stage-a": {"filename": "a.onnx", "run_on_prompt": True}},
                                              {"stage-b": {"filename": "b.onnx"}}])  # fmt: skip
    config["model"]["speech"] = {"filename": "s.onnx", "config_filename": "s.json", "adapter_filename": "s.bin"}
    named = dict(check_genai_config(config, ["cpu"]).named)
    assert named == {
        "model.decoder.filename": "model.onnx",
        "model.decoder.pipeline.stage-a.filename": "a.onnx",
        "model.decoder.pipeline.stage-b.filename": "b.onnx",
        "model.speech.filename": "s.onnx",
        "model.speech.config_filename": "s.json",
        "model.speech.adapter_filename": "s.bin",
    }


@pytest.mark.parametrize("config", [[], "model", 3])
def test_a_genai_config_that_is_not_an_object_is_refused(config: object) -> None:
    with pytest.raises(ConfigRefused, match="not a JSON object"):
        check_genai_config(config, ["cpu"])
