"""ONNX Runtime GenAI (`onnxruntime-genai`, `pip install 'edgefleet[genai]'`): the model builder's folder
(`genai_config.json`, `model.onnx` and its external data, the tokenizer), loaded whole.

Providers `onnxruntime-genai:cpu` and `onnxruntime-genai:cuda`. The agent's thread count becomes the decoder's
`intra_op_num_threads` (one inter-op thread), and the manifest's `runtime_config` entries are session options of the
decoder, both through `Config.overlay` (the same as editing `genai_config.json`). Before `og.Config` reads the
folder, its `genai_config.json` and the manifest's `runtime_config` are checked again against the allow-list
(edgefleet/core/bundle/runtime_config.py: nothing that loads a library, names a path or sets another provider),
as the install already did: a load that reaches here by another path refuses them too. One `og.Model` serves every
request: each generation has its own `Generator`, so generations run side by side. Cancellation is checked between
tokens.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
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
from edgefleet.agent.runtime.generative.session import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GenerativeSession,
    OnText,
    Stopper,
    TokenClock,
)
from edgefleet.core.bundle.runtime_config import (
    ORT_GENAI,
    ConfigRefused,
    check_genai_config,
    check_runtime_config,
)

log = logging.getLogger(__name__)

PREFIX = "onnxruntime-genai:"
_DEVICES = ("cpu", "cuda")


def _module() -> tuple[Any, str]:
    found = optional_import("onnxruntime_genai", package="onnxruntime-genai", extra="genai")
    return found.module, found.reason


@register
class OrtGenAIBackend(GenerativeBackend):
    key = "onnxruntime-genai"
    title = "ONNX Runtime GenAI"
    formats = ("onnx-genai",)
    known_providers = tuple(PREFIX + d for d in _DEVICES)

    def claims(self, provider: str) -> bool:
        return provider.startswith(PREFIX)

    def availability(self, provider: str) -> Availability:
        device = provider.removeprefix(PREFIX)
        if device not in _DEVICES:
            return Availability.no(f"ONNX Runtime GenAI has no device {device!r} (it runs {', '.join(_DEVICES)})")
        og, reason = _module()
        if og is None:
            return Availability.no(reason)
        if device == "cuda" and not og.is_cuda_available():
            return Availability.no(
                "ONNX Runtime GenAI finds no CUDA device or its CUDA libraries (onnxruntime-genai-cuda)"
            )
        return Availability.yes(f"onnxruntime-genai {distribution_version('onnxruntime-genai')} on {device}")

    def version(self, provider: str) -> str:
        return f"onnxruntime-genai {distribution_version('onnxruntime-genai') or 'not installed'}"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> GenerativeSession:
        og, reason = _module()
        if og is None:
            raise LoadError(reason)
        device = provider.removeprefix(PREFIX)
        _check_config(model_path, options.runtime_config, device)
        session_options: dict[str, Any] = {str(k): v for k, v in options.runtime_config.items()}
        if options.threads > 0:
            session_options |= {"intra_op_num_threads": options.threads, "inter_op_num_threads": 1}
        try:
            config = og.Config(str(model_path))
            config.clear_providers()
            if device != "cpu":
                config.append_provider(device)
            if session_options:
                config.overlay(json.dumps({"model": {"decoder": {"session_options": session_options}}}))
            model = og.Model(config)
            tokenizer = og.Tokenizer(model)
        except Exception as err:  # og raises RuntimeError with the runtime's own reason
            raise LoadError(f"ONNX Runtime GenAI cannot load {model_path.name}: {err}") from err
        return OrtGenAISession(og, model, tokenizer, provider, model_path, session_options)


def _check_config(model_dir: Path, runtime_config: Mapping[str, Any], device: str) -> None:
    """LoadError unless the folder's genai_config.json and the manifest's runtime_config pass the allow-list."""
    try:
        check_runtime_config(ORT_GENAI, runtime_config)
        text = (model_dir / "genai_config.json").read_text("utf-8")
        check_genai_config(json.loads(text), [device])
    except ConfigRefused as err:
        raise LoadError(f"ONNX Runtime GenAI is not given {model_dir.name}: {err}") from err
    except (OSError, ValueError) as err:
        raise LoadError(f"{model_dir.name}/genai_config.json is not readable JSON: {err}") from err


def _has_chat_template(model_dir: Path) -> bool:
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


class OrtGenAISession(GenerativeSession):
    def __init__(
        self, og: Any, model: Any, tokenizer: Any, provider: str, model_dir: Path, session_options: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self._og, self._model, self._tokenizer = og, model, tokenizer
        self.provider = provider
        self._session_options = dict(session_options)
        self._chat = _has_chat_template(model_dir)
        self._closed = threading.Event()

    def describe(self) -> dict[str, str]:
        return {"runtime": "onnxruntime-genai", **{k: str(v) for k, v in self._session_options.items()}}

    def generate(self, request: GenerationRequest, on_text: OnText, stopper: Stopper | None = None) -> GenerationResult:
        og, clock = self._og, TokenClock()
        prompt = list(request.prompt_ids)
        params = og.GeneratorParams(self._model)
        total = len(prompt) + request.max_new_tokens
        search: dict[str, Any] = {"max_length": total, "do_sample": request.sampling is not None}
        if request.ignore_stop:
            search["min_length"] = total
        if request.sampling is not None:
            sampling = request.sampling
            search |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
            if sampling.seed is not None:
                search["random_seed"] = sampling.seed
        params.set_search_options(**search)
        generator = og.Generator(self._model, params)
        step = request.step or nullcontext
        with step():
            generator.append_tokens(prompt)  # the prefill
        stream = self._tokenizer.create_stream()
        tokens: list[int] = []
        pieces: list[str] = []
        finish: FinishReason = "length"
        while not generator.is_done():
            if stopper is not None and stopper.stopped:
                finish = stopper.reason
                break
            with step():  # between tokens, the generation yields to real-time work (agent/schedule/gate.py)
                generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            clock.token()
            tokens.append(token)
            if token in request.stop_ids and not request.ignore_stop:
                finish = "stop"
                break
            piece = stream.decode(token)
            if piece:
                pieces.append(piece)
                on_text(piece)
        else:
            finish = "length" if len(tokens) >= request.max_new_tokens else "stop"  # og stopped at its own end token
        return GenerationResult(
            tuple(tokens), "".join(pieces), finish, len(prompt), clock.ttft_ms, clock.decode_ms,
            stopper.why if stopper is not None and finish == "cancelled" else "",
        )  # fmt: skip

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        params = self._og.GeneratorParams(self._model)
        params.set_search_options(max_length=len(ids))
        generator = self._og.Generator(self._model, params)
        generator.append_tokens(list(ids))
        return np.asarray(generator.get_output("logits"), dtype=np.float32)[0]  # every position, not the last only

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(np.asarray(ids, dtype=np.int32)))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str | None:
        if not self._chat:
            return None
        return str(self._tokenizer.apply_chat_template(json.dumps(list(messages)), add_generation_prompt=True))

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._tokenizer = self._model = None


__all__ = ["OrtGenAIBackend", "OrtGenAISession"]
