"""Triton's generate extension (provisional in Triton): `POST /v2/models/{name}[/versions/{v}]/generate` answers one
JSON object, `/generate_stream` the same objects as server-sent events.

Request: `{"text_input": "...", "parameters": {"max_tokens": 32, "temperature": 0.7, "top_p", "top_k", "seed",
"stop": [...], "stream": ..., "ignore_eos": false}, "id": ...}` (the parameters may also sit at the top level, as
TensorRT-LLM's and
vLLM's ensembles take them; `random_seed` and `stop_words` are accepted as names too). Answer: `{"model_name",
"model_version", "text_output", "finish_reason", "usage": {"prompt_tokens", "completion_tokens"}}` (and the
request's `id`); each streamed event holds the next piece of `text_output`, the last one `finish_reason` and
`usage`. An error after the stream began is an event `{"error": "..."}`.
"""

from __future__ import annotations

from typing import Any

from edgefleet.agent.api.body_guard import load_json
from edgefleet.agent.api.generation.call import (
    GenerationCall,
    bad,
    optional_bool,
    optional_int,
    sampling,
    stops,
    text,
)
from edgefleet.agent.runtime.generative import GenerationResult

_PARAMETERS = (
    "max_tokens", "temperature", "top_p", "top_k", "seed", "random_seed", "stop", "stop_words", "stream", "ignore_eos",
)  # fmt: skip
MAX_ID = 256


def parse(body: bytes, model: str) -> GenerationCall:
    document = load_json(body)
    if not isinstance(document, dict):
        raise bad("body", 'must be a JSON object {"text_input": ..., "parameters": {...}}')
    text_input = document.get("text_input")
    if isinstance(text_input, list) and len(text_input) == 1:
        text_input = text_input[0]
    if not isinstance(text_input, str):
        raise bad("text_input", "must be a string")
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise bad("parameters", "must be an object")
    merged = {**parameters, **{k: document[k] for k in _PARAMETERS if k in document}}
    if "seed" not in merged and "random_seed" in merged:
        merged["seed"] = merged["random_seed"]
    request_id = document.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > MAX_ID):
        raise bad("id", f"must be a string of at most {MAX_ID} characters")
    if request_id is not None:
        text(request_id, "id")
    return GenerationCall(
        model=model, operation="text_completion", prompt=text(text_input, "text_input"),
        max_tokens=optional_int(merged, "max_tokens", 1, 1 << 20), sampling=sampling(merged),
        stop=stops(merged.get("stop", merged.get("stop_words"))), stream=bool(optional_bool(merged, "stream")),
        request_id=request_id, ignore_eos=bool(optional_bool(merged, "ignore_eos")),
    )  # fmt: skip


def _head(call: GenerationCall, version: str) -> dict[str, Any]:
    document: dict[str, Any] = {"model_name": call.model, "model_version": version}
    if call.request_id is not None:
        document["id"] = call.request_id
    return document


def usage(result: GenerationResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.tokens)}


def answer(call: GenerationCall, version: str, result: GenerationResult) -> dict[str, Any]:
    return {**_head(call, version), "text_output": result.text, "finish_reason": result.finish_reason,
            "usage": usage(result)}  # fmt: skip


def piece(call: GenerationCall, version: str, text: str) -> dict[str, Any]:
    return {**_head(call, version), "text_output": text}


def last(call: GenerationCall, version: str, result: GenerationResult) -> dict[str, Any]:
    return {**_head(call, version), "text_output": "", "finish_reason": result.finish_reason, "usage": usage(result)}


def error(message: str) -> dict[str, Any]:
    return {"error": message}


__all__ = ["answer", "error", "last", "parse", "piece", "usage"]
