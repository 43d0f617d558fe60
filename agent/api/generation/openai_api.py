"""OpenAI-compatible completions and chat (`POST /v1/completions`, `POST /v1/chat/completions`), streamed or not, and
the model list's OpenAI shape; what the official `openai` client sends and parses.

Taken: `model`, `prompt` (text or token ids, one prompt) or `messages` (text content), `max_tokens` (chat also
`max_completion_tokens`), `temperature` (absent or 0: greedy, the bundle's own decoding; OpenAI's default would be
sampling at 1), `top_p`, `top_k` (not OpenAI's; vLLM's), `seed`, `stop` (up to 4 strings), `stream`,
`stream_options.include_usage`, `n` = 1, `ignore_eos` (vLLM's: the whole budget, for benchmarks). Refused with a 400
naming the field: `n` > 1, `echo`, `logprobs`, `tools`, `best_of` > 1. Other fields (`user`, `presence_penalty`, ...)
are ignored. Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` with the agent's error kind as
the type.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from edgefleet.agent.api.answers import Answers, error_object
from edgefleet.agent.api.body_guard import load_json
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.call import (
    GenerationCall,
    bad,
    messages,
    optional_bool,
    optional_int,
    prompt,
    sampling,
    stops,
)
from edgefleet.agent.api.http.protocol import Response
from edgefleet.agent.api.wire import JSON
from edgefleet.agent.runtime.generative import GenerationResult
from edgefleet.core.bundle.manifest import Manifest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OWNER = "edgefleet"
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # the names the routes take (agent/api/routes.py)


def _document(body: bytes) -> dict[str, Any]:
    document = load_json(body)
    if not isinstance(document, dict):
        raise bad("body", "must be a JSON object")
    model = document.get("model")
    if not isinstance(model, str) or not MODEL_NAME.fullmatch(model):
        raise bad("model", "must name the served model (letters, digits, '.', '_', '-'; at most 64)")
    if (n := optional_int(document, "n", 1, 128)) not in (None, 1):
        raise bad("n", f"one choice per request (n=1), not {n}")
    if (best_of := optional_int(document, "best_of", 1, 128)) not in (None, 1):
        raise bad("best_of", f"not supported ({best_of})")
    if document.get("logprobs") not in (None, False):
        raise bad("logprobs", "not supported")
    if document.get("tools") or document.get("functions"):
        raise bad("tools", "tool calls are not supported")
    return document


def _usage_option(document: dict[str, Any]) -> bool:
    options = document.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad("stream_options", "must be an object")
    return bool(optional_bool(options, "include_usage"))


def parse_completion(body: bytes) -> GenerationCall:
    document = _document(body)
    if document.get("echo"):
        raise bad("echo", "not supported")
    if document.get("suffix"):
        raise bad("suffix", "not supported")
    return GenerationCall(
        model=document["model"], operation="text_completion", prompt=prompt(document.get("prompt")),
        max_tokens=optional_int(document, "max_tokens", 1, 1 << 20), sampling=sampling(document),
        stop=stops(document.get("stop")), stream=bool(optional_bool(document, "stream")),
        include_usage=_usage_option(document), ignore_eos=bool(optional_bool(document, "ignore_eos")),
    )  # fmt: skip


def parse_chat(body: bytes) -> GenerationCall:
    document = _document(body)
    limit = optional_int(document, "max_completion_tokens", 1, 1 << 20)
    return GenerationCall(
        model=document["model"], operation="chat", messages=messages(document.get("messages")),
        max_tokens=limit if limit is not None else optional_int(document, "max_tokens", 1, 1 << 20),
        sampling=sampling(document), stop=stops(document.get("stop")), stream=bool(optional_bool(document, "stream")),
        include_usage=_usage_option(document), ignore_eos=bool(optional_bool(document, "ignore_eos")),
    )  # fmt: skip


def new_id(call: GenerationCall) -> str:
    return ("chatcmpl-" if call.operation == "chat" else "cmpl-") + os.urandom(12).hex()


def usage(result: GenerationResult) -> dict[str, int]:
    prompt_tokens, completion = result.prompt_tokens, len(result.tokens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


class Answer:
    """The documents of one answer (whole, or the chunks of a stream), sharing its id and creation time."""

    def __init__(self, call: GenerationCall) -> None:
        self.call, self.id, self.created = call, new_id(call), int(time.time())
        self.chat = call.operation == "chat"

    def _head(self, streamed: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if streamed and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.call.model}

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": result.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice |= {"text": result.text, "logprobs": None}
        return {**self._head(False), "choices": [choice], "usage": usage(result)}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, *, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice |= {"text": text or "", "logprobs": None}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": usage(result)}


def error_document(err: RequestError) -> dict[str, Any]:
    return {"error": error_object(err)}


def error_response(answers: Answers, err: RequestError, model: str = "-") -> Response:
    answers.count(model, err.status, err.kind)
    headers = {"X-Error-Kind": err.kind}
    if err.status == 503:
        headers["Retry-After"] = "1"
    return Response(err.status, json.dumps(error_document(err)).encode(), JSON, headers)


def model_entry(manifest: Manifest, created: int) -> dict[str, Any]:
    """A model as OpenAI's model list and retrieve calls describe one."""
    return {"id": manifest.model_name, "object": "model", "created": created, "owned_by": OWNER}


__all__ = [
    "CHAT",
    "COMPLETIONS",
    "Answer",
    "error_document",
    "error_response",
    "model_entry",
    "parse_chat",
    "parse_completion",
    "usage",
]
