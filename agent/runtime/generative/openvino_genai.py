"""OpenVINO GenAI (`openvino-genai` with `openvino-tokenizers`, `pip install 'edgefleet[openvino-genai]'`): a stateful
LLM IR folder (`openvino_model.xml`/`.bin`, `openvino_tokenizer.xml`, `openvino_detokenizer.xml`), loaded whole by
`LLMPipeline`.

Providers `openvino-genai:CPU|GPU|NPU`. The agent's thread count is `INFERENCE_NUM_THREADS`; the manifest's
`runtime_config` (INFERENCE_PRECISION_HINT, KV_CACHE_PRECISION, DYNAMIC_QUANTIZATION_GROUP_SIZE: the properties the
build was judged with; on AVX-512 BF16 CPUs OpenVINO's defaults are bf16 compute, a u8 KV cache and int8
activations) is applied to the pipeline and to the logits model, once it passed the allow-list of
edgefleet/core/bundle/runtime_config.py (no EXTENSIONS, CONFIG_FILE or CACHE_DIR: nothing that loads a library or
names a path). Token ids arrive one by one and are decoded to text
(agent/runtime/generative/detokenizer.py) at once for the first, then at most every 2 ms: a text piece may hold
several tokens. An `LLMPipeline` runs one generation at a time
(a second `generate` while one runs is refused by the runtime), so generations on one session take turns. Teacher-
forced logits come from the same IR compiled once more with `openvino.Core` (compiled at the first golden check).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.runtime.backends import (
    Availability,
    CancelToken,
    LoadError,
    LoadOptions,
    distribution_version,
    optional_import,
    register,
)
from edgefleet.agent.runtime.generative.backend import GenerativeBackend
from edgefleet.agent.runtime.generative.detokenizer import IncrementalDecoder
from edgefleet.agent.runtime.generative.session import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GenerativeSession,
    OnText,
    Stopper,
    TokenClock,
)
from edgefleet.core.bundle.runtime_config import OPENVINO_GENAI, ConfigRefused, check_runtime_config

log = logging.getLogger(__name__)

PREFIX = "openvino-genai:"
_DEVICES = ("CPU", "GPU", "NPU")
DECODE_EVERY_S = 0.002  # token ids are decoded to text at most this often (the first at once): a decode costs ~50 µs
_PIPELINE_ONLY = frozenset({"ATTENTION_BACKEND", "CACHE_SIZE", "SCHEDULER_CONFIG", "PREFILL_HINT", "GENERATE_HINT"})


def _modules() -> tuple[Any, Any, str]:
    genai = optional_import("openvino_genai", package="openvino-genai", extra="openvino-genai")
    if genai.module is None:
        return None, None, genai.reason
    tokenizers = optional_import("openvino_tokenizers", package="openvino-tokenizers", extra="openvino-genai")
    if tokenizers.module is None:
        return None, None, tokenizers.reason
    openvino = optional_import("openvino", package="openvino", extra="openvino-genai")
    return genai.module, openvino.module, openvino.reason


@register
class OpenVINOGenAIBackend(GenerativeBackend):
    key = "openvino-genai"
    title = "OpenVINO GenAI"
    formats = ("openvino-genai",)
    known_providers = tuple(PREFIX + d for d in _DEVICES)

    def __init__(self) -> None:
        self._devices: list[str] | None = None

    def claims(self, provider: str) -> bool:
        return provider.startswith(PREFIX)

    def availability(self, provider: str) -> Availability:
        device = provider.removeprefix(PREFIX)
        if device not in _DEVICES:
            return Availability.no(f"OpenVINO GenAI has no device {device!r} (it runs {', '.join(_DEVICES)})")
        genai, openvino, reason = _modules()
        if genai is None or openvino is None:
            return Availability.no(reason)
        if self._devices is None:
            self._devices = list(openvino.Core().available_devices)
        if not any(d == device or d.startswith(device + ".") for d in self._devices):
            return Availability.no(f"OpenVINO sees no {device} device here (it sees {', '.join(self._devices)})")
        return Availability.yes(f"openvino-genai {distribution_version('openvino-genai')} on {device}")

    def version(self, provider: str) -> str:
        return f"openvino-genai {distribution_version('openvino-genai') or 'not installed'}"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> GenerativeSession:
        genai, openvino, reason = _modules()
        if genai is None or openvino is None:
            raise LoadError(reason)
        try:
            check_runtime_config(OPENVINO_GENAI, options.runtime_config)
        except ConfigRefused as err:
            raise LoadError(f"OpenVINO GenAI is not given {model_path.name}: {err}") from err
        properties: dict[str, Any] = dict(options.runtime_config)
        if options.threads > 0:
            properties["INFERENCE_NUM_THREADS"] = options.threads
        device = provider.removeprefix(PREFIX)
        try:
            pipeline = genai.LLMPipeline(str(model_path), device, **properties)
        except Exception as err:  # the runtime's own reason (a missing tokenizer model, a bad IR)
            raise LoadError(f"OpenVINO GenAI cannot load {model_path.name}: {err}") from err
        return OpenVINOGenAISession(genai, openvino, pipeline, provider, model_path, properties)


class OpenVINOGenAISession(GenerativeSession):
    def __init__(
        self, genai: Any, openvino: Any, pipeline: Any, provider: str, model_dir: Path, properties: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self._genai, self._openvino, self._pipeline = genai, openvino, pipeline
        self._tokenizer = pipeline.get_tokenizer()
        self.provider, self._model_dir, self._properties = provider, model_dir, dict(properties)
        self._lock = threading.Lock()  # one generation at a time on an LLMPipeline
        self._logits_lock = threading.Lock()
        self._logits_model: Any = None

    def describe(self) -> dict[str, str]:
        return {"runtime": "openvino-genai", **{k: str(v) for k, v in self._properties.items()}}

    def generate(self, request: GenerationRequest, on_text: OnText, stopper: Stopper | None = None) -> GenerationResult:
        genai, clock = self._genai, TokenClock()
        config = genai.GenerationConfig()
        config.max_new_tokens = request.max_new_tokens
        if request.ignore_stop:
            config.min_new_tokens, config.ignore_eos = request.max_new_tokens, True
        elif request.stop_ids:
            config.stop_token_ids = set(request.stop_ids)
        sampling = request.sampling
        config.do_sample = sampling is not None
        if sampling is not None:
            config.temperature, config.top_p, config.top_k = sampling.temperature, sampling.top_p, sampling.top_k
            if sampling.seed is not None:
                config.rng_seed = sampling.seed
        decoder = IncrementalDecoder(self.decode)
        tokens: list[int] = []
        pieces: list[str] = []
        state: dict[str, Any] = {"finish": None, "decoded": 0.0}
        running, stop = genai.StreamingStatus.RUNNING, genai.StreamingStatus.STOP

        def emit(piece: str) -> None:
            if piece:
                pieces.append(piece)
                on_text(piece)

        def write(token: int | list[int]) -> Any:
            for one in token if isinstance(token, list) else [token]:
                if state["finish"] is not None:
                    return stop
                clock.token()
                one = int(one)
                tokens.append(one)
                if one in request.stop_ids and not request.ignore_stop:
                    state["finish"] = "stop"
                    return stop
                decoder.add(one)
                now = time.perf_counter()
                if len(tokens) == 1 or now - state["decoded"] >= DECODE_EVERY_S:
                    state["decoded"] = now
                    emit(decoder.take())
                if stopper is not None and stopper.stopped:
                    state["finish"] = stopper.reason
                    return stop
            if request.step is not None:  # the pipeline waits for its streamer: between tokens, yield to real-time
                with request.step():  # work (agent/schedule/gate.py; the token's own compute is not bracketed)
                    pass
            return running

        streamer = _streamer(genai, write)
        prompt = list(request.prompt_ids)
        ids = np.asarray([prompt], dtype=np.int64)
        inputs = genai.TokenizedInputs(self._openvino.Tensor(ids), self._openvino.Tensor(np.ones_like(ids)))
        with self._lock:  # a turn waited for is part of the time to the first token
            self._pipeline.generate(inputs, config, streamer)
        emit(decoder.take() + decoder.flush())
        finish: FinishReason = state["finish"] or ("length" if len(tokens) >= request.max_new_tokens else "stop")
        why = stopper.why if stopper is not None and finish == "cancelled" else ""
        return GenerationResult(
            tuple(tokens), "".join(pieces), finish, len(prompt), clock.ttft_ms, clock.decode_ms, why
        )

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        with self._logits_lock:
            if self._logits_model is None:
                properties = {k: v for k, v in self._properties.items() if k not in _PIPELINE_ONLY}
                core = self._openvino.Core()
                device = self.provider.removeprefix(PREFIX)
                self._logits_model = core.compile_model(str(self._model_dir / "openvino_model.xml"), device, properties)
            compiled = self._logits_model
        request = compiled.create_infer_request()
        request.reset_state()  # an empty KV cache
        count = len(ids)
        names = {name for port in compiled.inputs for name in port.get_names()}
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray([list(ids)], dtype=np.int64),
            "attention_mask": np.ones((1, count), dtype=np.int64),
        }
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(count, dtype=np.int64)[None]
        if "beam_idx" in names:
            feeds["beam_idx"] = np.zeros(1, dtype=np.int32)
        request.infer(feeds)
        return np.array(request.get_tensor("logits").data[0], dtype=np.float32)  # every position: the IR is not sliced

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text).input_ids.data.reshape(-1)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids])) if len(ids) else ""

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str | None:
        if not self._tokenizer.chat_template:
            return None
        return str(self._tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True))

    def close(self) -> None:
        with self._lock, self._logits_lock:
            self._pipeline = self._logits_model = None


_STREAMER: dict[int, Any] = {}


def _streamer(genai: Any, write: Any) -> Any:
    """A `StreamerBase` handing each token id to `write`. Its class needs the imported runtime, so it is made at
    the first call and kept (a class made per generation cost about a millisecond of its time to first token)."""
    cls = _STREAMER.get(id(genai))
    if cls is None:

        class _TokenStreamer(genai.StreamerBase):
            def __init__(self, write: Any) -> None:
                super().__init__()
                self._write = write

            def write(self, token: int | list[int]) -> Any:
                return self._write(token)

            def end(self) -> None:
                return None

        cls = _STREAMER[id(genai)] = _TokenStreamer
    return cls(write)


__all__ = ["OpenVINOGenAIBackend", "OpenVINOGenAISession"]
