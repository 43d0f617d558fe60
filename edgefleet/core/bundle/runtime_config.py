"""A bundle's runtime configuration is data, never code: what the agent passes on to a generation runtime from a
bundle, and why it refuses the rest.

A generative bundle carries runtime configuration in two places: the manifest's `generation.runtime_config` (ONNX
Runtime GenAI session options of the decoder, or OpenVINO GenAI properties) and, for ONNX Runtime GenAI, the
`genai_config.json` of its model folder (the runtime's own file: the model's structure, search defaults, and session
options for each model part). Each is checked against an allow-list before anything loads it:
- a key the agent does not pass on is refused, naming it; so is a value outside what the key takes;
- a key that loads a library (`custom_ops_library`; OpenVINO's `EXTENSIONS`), writes files or names a path
  (`enable_profiling`, `ep.context_file_path`, OpenVINO's `CACHE_DIR`) is refused with that reason: native custom-op
  libraries load only from the device's own `--custom-op-libs` opt-in (agent/runtime/custom_ops.py);
- `provider_options` may name only the providers the bundle lists and its profile allows;
- the files `genai_config.json` names (`filename`, `config_filename`, `adapter_filename`, `data_file`,
  `tokenizer_dir`) are returned to the caller, which checks each is a signed file inside the bundle
  (agent/install/signed_files.py).

Pure functions of the configuration: no file is read here. The tables are what edgefleet's converter writes plus the
tuning keys a bundle might sensibly carry; everything else is refused, so a key a runtime adds later is refused until
it is added here. Both sides use it: the agent refuses such a bundle (agent/install/signed_files.py, and each
generation backend before it loads), and the converter refuses to write one (converter/generative/bundle.py), so what
it ships always passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from edgefleet.core.errors import BundleError

ORT_GENAI, OPENVINO_GENAI = "onnxruntime-genai", "openvino-genai"


class ConfigRefused(BundleError):
    """A runtime configuration from a bundle that the agent will not pass on; the message says which key and why."""


Check = Callable[[object], str | None]  # a value → why it is refused (None: allowed)


def _one_of(*allowed: object) -> Check:
    def check(value: object) -> str | None:
        if any(value == a and type(value) is type(a) for a in allowed):
            return None
        return f"takes one of {', '.join(repr(a) for a in allowed)}"

    return check


def _integer(low: int, high: int, *, text: bool = False) -> Check:
    """An int in [low, high]; with `text`, also its decimal string (ORT config entries are strings)."""

    def check(value: object) -> str | None:
        number = value
        if text and isinstance(value, str) and value.lstrip("-").isdigit():
            number = int(value)
        if isinstance(number, int) and not isinstance(number, bool) and low <= number <= high:
            return None
        return f"takes an integer from {low} to {high}"

    return check


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else "takes true or false"


def _flag(value: object) -> str | None:
    return None if value in ("0", "1") else 'takes "0" or "1"'


def _name(value: object) -> str | None:
    """A short label (ORT's log id): printable, no path separators."""
    if isinstance(value, str) and len(value) <= 64 and value.isprintable() and not set(value) & set("/\\"):
        return None
    return "takes a short label without path separators"


def _names(value: object) -> str | None:
    """A comma-separated list of identifiers (ORT optimizer names)."""
    if isinstance(value, str) and len(value) <= 1024 and all(p.isidentifier() for p in value.split(",")):
        return None
    return "takes comma-separated optimizer names"


_OPTIMIZATION_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")

# ONNX Runtime (GenAI) session options: genai_config.json's `session_options` of any model part, and the manifest's
# runtime_config for an onnx-genai bundle (applied to the decoder). Keys ORT GenAI does not know become ORT session
# config entries (AddConfigEntry), so those are listed here too, each with the values it takes.
ORT_SESSION_OPTIONS: dict[str, Check] = {
    "log_id": _name,
    "intra_op_num_threads": _integer(0, 1024),
    "inter_op_num_threads": _integer(0, 1024),
    "log_severity_level": _integer(0, 4),
    "log_verbosity_level": _integer(0, 4),
    "enable_cpu_mem_arena": _boolean,
    "enable_mem_pattern": _boolean,
    "graph_optimization_level": _one_of(*_OPTIMIZATION_LEVELS),
    "session.intra_op.allow_spinning": _flag,
    "session.inter_op.allow_spinning": _flag,
    "session.disable_prepacking": _flag,
    "session.set_denormal_as_zero": _flag,
    "session.disable_cpu_ep_fallback": _flag,
    "session.disable_quant_qdq": _flag,
    "session.enable_quant_qdq_cleanup": _flag,
    "session.qdqisint8allowed": _flag,
    "session.x64quantprecision": _flag,
    "session.disable_aot_function_inlining": _flag,
    "session.dynamic_block_base": _integer(0, 1 << 16, text=True),
    "mlas.enable_gemm_fastmath_arm64_bfloat16": _flag,
    "session.use_device_allocator_for_initializers": _flag,
    "optimization.disable_specified_optimizers": _names,
    "ep.cuda.fpa_intb_gemm": _flag,  # the model builder's CUDA INT4 kernels
}
# Keys refused with a reason of their own (any other key: "not a key the agent passes on").
ORT_REFUSED: dict[str, str] = {
    "custom_ops_library": "loads a native library into the agent; custom-op libraries load only from the device's "
    "own --custom-op-libs folders",
    "enable_profiling": "writes profiling files to a path the bundle chooses",
    "ep.context_file_path": "names a path",
    "ep.context_enable": "writes a compiled model to a path",
    "session.optimized_model_external_initializers_file_name": "names a path",
    "session.load_model_format": "changes how the model file is parsed",
    "session.use_ort_model_bytes_directly": "changes how the model file is parsed",
}
# Options per provider inside `provider_options` (the provider named as ORT GenAI names it, lower case).
ORT_PROVIDER_OPTIONS: dict[str, dict[str, Check]] = {
    "cpu": {},
    "cuda": {
        "enable_cuda_graph": _flag,
        "enable_skip_layer_norm_strict_mode": _flag,
        "prefer_nhwc": _flag,
        "use_tf32": _flag,
    },
}

# OpenVINO GenAI properties (LLMPipeline and the logits model's compile_model): the manifest's runtime_config for an
# openvino-genai bundle.
_PRECISIONS = ("f32", "f16", "bf16", "u8", "i8", "u4")
OPENVINO_PROPERTIES: dict[str, Check] = {
    "INFERENCE_PRECISION_HINT": _one_of("f32", "f16", "bf16"),
    "KV_CACHE_PRECISION": _one_of(*_PRECISIONS),
    "KEY_CACHE_PRECISION": _one_of(*_PRECISIONS),
    "VALUE_CACHE_PRECISION": _one_of(*_PRECISIONS),
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": _integer(0, 1 << 16),
    "KEY_CACHE_GROUP_SIZE": _integer(0, 1 << 16),
    "VALUE_CACHE_GROUP_SIZE": _integer(0, 1 << 16),
    "INFERENCE_NUM_THREADS": _integer(0, 1024),
    "NUM_STREAMS": _integer(1, 64),
    "PERFORMANCE_HINT": _one_of("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"),
    "EXECUTION_MODE_HINT": _one_of("PERFORMANCE", "ACCURACY"),
    "SCHEDULING_CORE_TYPE": _one_of("ANY_CORE", "PCORE_ONLY", "ECORE_ONLY"),
    "ENABLE_CPU_PINNING": _one_of("YES", "NO"),
    "ENABLE_HYPER_THREADING": _one_of("YES", "NO"),
    "ATTENTION_BACKEND": _one_of("PA", "SDPA"),
    "PREFILL_HINT": _one_of("DYNAMIC", "STATIC"),
    "GENERATE_HINT": _one_of("FAST_COMPILE", "BEST_PERF"),
    "MAX_PROMPT_LEN": _integer(1, 1 << 20),
    "MIN_RESPONSE_LEN": _integer(1, 1 << 20),
}
OPENVINO_REFUSED: dict[str, str] = {
    "EXTENSIONS": "loads native extension libraries into the agent",
    "CONFIG_FILE": "names a plugin configuration file, which loads native plugins",
    "CACHE_DIR": "names a path",
    "BLOB_PATH": "names a path",
    "NPUW_DUMP_IO": "writes files",
}

# genai_config.json: the keys of its structure (every name ONNX Runtime GenAI's config parser knows, and its model
# builder writes, besides the session, run and provider options handled above). Their values are numbers, flags,
# tensor names or file names.
GENAI_FILE_KEYS = frozenset({"filename", "config_filename", "adapter_filename", "data_file", "tokenizer_dir"})
GENAI_SECTIONS = frozenset({"model", "search", "engine"})
_STRUCTURE_NAMES = """
    alignment attention_mask attention_metadata audio_embeds audio_features audio_projection_mode audio_sizes
    audio_token_id batch_size blank_id blank_penalty block_size block_table block_table_windowed boa_token_id
    bos_token_id cache_indirection cache_last_channel cache_last_channel_len cache_last_channel_len_next
    cache_last_channel_next cache_last_time cache_last_time_next cache_slack chunk_samples chunk_size context_length
    conv_cache_size conv_context cooldown cross_past_key_names cross_past_value_names cross_present_key_names
    cross_present_value_names cumulative_sequence_lengths current_sequence_length data_type decoder decoder_outputs
    decoder_start_token_id diversity_penalty do_sample draft dynamic_batching early_stopping embedding encoder
    encoder_attention_mask encoder_hidden_states encoder_outputs eos_token_id fft_size gpu_utilization_factor
    head_size hidden_size hidden_states hop_length image_features image_grid_thw image_sizes image_token_id
    inherit_session_options input_ids input_lengths inputs inputs_embeds is_lm_head joiner lang_id layer_types
    layers left_context left_context_samples length length_penalty log_eps logits lstm_cell_state lstm_hidden_state
    main_hidden_states max_batch_size max_draft_tokens max_length max_scheduled_tokens max_symbols_per_step
    min_adaptive_k min_length mtp name ngram_chained_lookup ngram_size no_repeat_ngram_size norm_eps
    num_attention_heads num_beams num_blocks num_hidden_layers num_key_value_heads num_mels num_return_sequences
    num_visual_tokens offset output_cross_qk_names output_lengths output_names_forwarder outputs outputs_length
    pad_token_id pad_value past_conv_names past_key_names past_key_values_length past_names
    past_present_share_buffer past_sequence_length past_sequence_lengths past_value_names patch_size per_layer_inputs
    pipeline pixel_position_ids pixel_values position_ids pre_encode_cache_size preemph prefix_padding_ms
    present_conv_names present_key_names present_names present_value_names random_seed repetition_penalty
    reset_session_idx right_context_samples rnn_states rnn_states_prev run_on_cpu run_on_prompt run_on_token_gen
    sample_rate sep_token_id shape shared_initializers silence_duration_ms slide_inputs slide_key_value_cache
    sliding_window spatial_merge_size speculative speech static_batching subsampling_factor targets targets_length
    tdt_durations temperature threshold tokens_per_second top_k top_p total_sequence_length type vad video_token_id
    vision vision_start_token_id vocab_size win_length window_size
    logits_indices past_key_scale_names past_value_scale_names present_key_scale_names present_value_scale_names
    past_recurrent_names present_recurrent_names prefix_caching state_groups state_update_capacity state_update_active
    state_update_capture_count state_update_conv_value_names state_update_recurrent_capsule_names window_kv_cache
    window_kv_cache_slack"""
GENAI_STRUCTURE = frozenset(_STRUCTURE_NAMES.split())
_LIBRARY_SUFFIXES = (".so", ".dll", ".dylib")


def _refuse(where: str, key: str, why: str) -> ConfigRefused:
    return ConfigRefused(f"{where}: {key!r} {why}")


def _check_entries(
    where: str, entries: Mapping[str, object], allowed: Mapping[str, Check], refused: Mapping[str, str]
) -> None:
    for key, value in entries.items():
        if key in refused:
            raise _refuse(where, key, refused[key])
        check = allowed.get(key)
        if check is None:
            passes = ", ".join(sorted(allowed)) or "none"
            raise _refuse(where, key, f"is not a key the agent passes on (it passes {passes})")
        why = check(value)
        if why is not None:
            raise _refuse(where, key, f"{why}, not {value!r}")


def runtime_of(bundle_format: str) -> str:
    """The generation runtime a bundle format is loaded by ("" for a format that is not generative)."""
    return {"onnx-genai": ORT_GENAI, "openvino-genai": OPENVINO_GENAI}.get(bundle_format, "")


def check_runtime_config(runtime: str, config: Mapping[str, object], where: str = "generation.runtime_config") -> None:
    """ConfigRefused unless every entry of a bundle's runtime_config for `runtime` is on its allow-list."""
    if runtime == ORT_GENAI:
        _check_entries(where, config, ORT_SESSION_OPTIONS, ORT_REFUSED)
    elif runtime == OPENVINO_GENAI:
        _check_entries(where, config, OPENVINO_PROPERTIES, OPENVINO_REFUSED)
    elif config:
        raise ConfigRefused(f"{where}: the agent passes no runtime configuration to {runtime!r}")


@dataclass(frozen=True)
class GenaiConfigFiles:
    """The files a genai_config.json names: (where in the file, the path relative to the model folder)."""

    named: tuple[tuple[str, str], ...]


def check_genai_config(config: object, devices: Iterable[str]) -> GenaiConfigFiles:
    """ConfigRefused unless `config` (a parsed genai_config.json) holds only allow-listed keys and values, and its
    `provider_options` name only `devices` (ONNX Runtime GenAI's provider names: cpu, cuda); the files it names."""
    if not isinstance(config, dict):
        raise ConfigRefused("genai_config.json is not a JSON object")
    allowed_devices = {d.lower() for d in devices}
    named: list[tuple[str, str]] = []
    for section, node in config.items():
        if section not in GENAI_SECTIONS:
            sections = ", ".join(sorted(GENAI_SECTIONS))
            raise _refuse("genai_config.json", section, f"is not a section the agent passes on ({sections})")
        _walk(node, section, allowed_devices, named)
    return GenaiConfigFiles(tuple(named))


def _walk(node: object, where: str, devices: set[str], named: list[tuple[str, str]]) -> None:
    if isinstance(node, list):
        for index, item in enumerate(node):
            _walk(item, f"{where}[{index}]", devices, named)
        return
    if isinstance(node, str):
        if node.lower().endswith(_LIBRARY_SUFFIXES) or ".so." in node.lower():
            raise ConfigRefused(f"genai_config.json {where} names a native library ({node!r})")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        here = f"{where}.{key}"
        if key == "session_options":
            _session_options(value, here, devices)
        elif key == "run_options":
            if not isinstance(value, dict):
                raise ConfigRefused(f"genai_config.json {here} is not an object")
            _check_entries(f"genai_config.json {here}", value, {}, {})
        elif key in GENAI_FILE_KEYS:
            if not isinstance(value, str):
                raise ConfigRefused(f"genai_config.json {here} names a file that is not a string: {value!r}")
            named.append((here, value))
        elif key in ORT_REFUSED:
            raise _refuse(f"genai_config.json {where}", key, ORT_REFUSED[key])
        elif key == "pipeline":  # its stages (an object, or a list of objects) are named by the model's author
            for stages in value if isinstance(value, list) else [value]:
                if not isinstance(stages, dict):
                    raise ConfigRefused(f"genai_config.json {here} holds {stages!r}, not an object of stages")
                for stage, body in stages.items():
                    _walk(body, f"{here}.{stage}", devices, named)
        elif key in GENAI_STRUCTURE:
            _walk(value, here, devices, named)
        else:
            raise _refuse(f"genai_config.json {where}", key, "is not a key the agent passes on")


def _session_options(value: object, where: str, devices: set[str]) -> None:
    if not isinstance(value, dict):
        raise ConfigRefused(f"genai_config.json {where} is not an object")
    entries = dict(value)
    providers = entries.pop("provider_options", [])
    _check_entries(f"genai_config.json {where}", entries, ORT_SESSION_OPTIONS, ORT_REFUSED)
    if not isinstance(providers, list):
        raise ConfigRefused(f"genai_config.json {where}.provider_options is not a list")
    for item in providers:
        if not isinstance(item, dict):
            raise ConfigRefused(f"genai_config.json {where}.provider_options holds {item!r}, not an object")
        for name, options in item.items():
            provider = str(name).lower().removesuffix("executionprovider")
            if provider not in devices:
                allowed = ", ".join(sorted(devices)) or "none"
                raise ConfigRefused(
                    f"genai_config.json {where}.provider_options sets provider {name!r}, which the bundle's profile "
                    f"does not allow here (allowed: {allowed})"
                )
            if not isinstance(options, dict):
                raise ConfigRefused(f"genai_config.json {where}.provider_options.{name} is not an object")
            _check_entries(f"genai_config.json {where}.provider_options.{name}", options,
                           ORT_PROVIDER_OPTIONS.get(provider, {}), {})  # fmt: skip


__all__ = [
    "OPENVINO_GENAI",
    "ORT_GENAI",
    "ConfigRefused",
    "GenaiConfigFiles",
    "check_genai_config",
    "check_runtime_config",
    "runtime_of",
]
