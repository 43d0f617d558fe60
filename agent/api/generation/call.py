"""A generation request as every endpoint hands it to the runner, whatever its wire format (Triton's generate,
OpenAI's completions and chat, MQTT), and the parameter checks they share. Each refusal is a 400 naming the field.

Every parameter is checked here against what both generation runtimes accept (ONNX Runtime GenAI, OpenVINO GenAI),
so that a request the runtime would refuse never reaches it, where its refusal would look like the model's own
failure. Measured on tinylm with both runtimes (`tests/unit/agent/test_generation_parameters.py` holds the
ranges, `tests/integration/agent/api/test_local_api_properties.py` the runtimes): a seed of 2^31 or more fails in ORT
GenAI (its `random_seed` is a C int), `top_k` above the vocabulary size fails in ORT GenAI (checked against the model
by the runner), `top_p` 0 with sampling fails in OpenVINO GenAI, an empty prompt fails in both, and text that is not
Unicode (a lone surrogate, which JSON's `\ud800` escape can carry and UTF-8 cannot encode) fails in both
tokenizers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.runtime.generative import ROLES, Sampling

Operation = Literal["text_completion", "chat"]  # OpenTelemetry's gen_ai.operation.name values
MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 256
SEED_MAX = 2**31 - 1  # ORT GenAI's random_seed is a 32-bit int (2**31 fails there); OpenVINO GenAI takes more
TOP_K_MAX = 1 << 20  # a bound for the parser; the runner refuses a top_k above the model's vocabulary size


@dataclass(frozen=True)
class GenerationCall:
    model: str
    operation: Operation
    prompt: str | tuple[int, ...] = ""  # text, or token ids; a chat's comes from its messages
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)
    max_tokens: int | None = None  # None: the bundle's default budget
    sampling: Sampling | None = None  # None: greedy
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    request_id: str | None = None
    ignore_eos: bool = False  # run the whole budget past end tokens (vLLM's; for benchmarks)


def bad(field: str, message: str) -> RequestError:
    return RequestError(400, "bad-request", f"{field}: {message}")


def optional_int(document: Mapping[str, Any], field: str, low: int, high: int) -> int | None:
    value = document.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, f"must be an integer, not {value!r}")
    if not low <= value <= high:
        raise bad(field, f"must be between {low} and {high}, not {value}")
    return value


def optional_float(document: Mapping[str, Any], field: str, low: float, high: float) -> float | None:
    value = document.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(field, f"must be a number, not {value!r}")
    if not low <= value <= high:
        raise bad(field, f"must be between {low:g} and {high:g}, not {value:g}")
    return float(value)


def optional_bool(document: Mapping[str, Any], field: str) -> bool | None:
    value = document.get(field)
    if value is not None and not isinstance(value, bool):
        raise bad(field, f"must be true or false, not {value!r}")
    return value


def sampling(document: Mapping[str, Any], seed_field: str = "seed") -> Sampling | None:
    """Greedy when `temperature` is absent or 0 (the bundle's own decoding); else sampling with top_p and top_k.
    Every value is checked whether or not it is used, so a request is refused or taken the same whatever its
    temperature."""
    temperature = optional_float(document, "temperature", 0.0, 2.0)
    top_p = optional_float(document, "top_p", 0.0, 1.0)
    top_k = optional_int(document, "top_k", 0, TOP_K_MAX)
    seed = optional_int(document, seed_field, 0, SEED_MAX)
    if not temperature:
        return None
    if top_p is not None and top_p <= 0:
        raise bad("top_p", "must be above 0 when sampling (temperature > 0)")
    return Sampling(temperature, 1.0 if top_p is None else top_p, top_k or 0, seed)


def text(value: str, field: str) -> str:
    """Text the tokenizer can take: valid Unicode (a lone surrogate, e.g. from JSON's "\\ud800", is refused)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad(field, f"is not valid Unicode (a lone surrogate at character {err.start})") from err
    return value


def stops(value: Any, field: str = "stop") -> tuple[str, ...]:
    if value is None:
        return ()
    found = [value] if isinstance(value, str) else value
    if not isinstance(found, list) or not all(isinstance(s, str) for s in found):
        raise bad(field, "must be a string or a list of strings")
    if len(found) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in found):
        raise bad(field, f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters")
    return tuple(text(s, field) for s in found if s)


def messages(value: Any) -> tuple[tuple[str, str], ...]:
    """Chat messages: each {"role", "content"}, the content a string or a list of text parts."""
    if not isinstance(value, list) or not value:
        raise bad("messages", "must be a non-empty list of {role, content}")
    if len(value) > MAX_MESSAGES:
        raise bad("messages", f"at most {MAX_MESSAGES} messages")
    found = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(where, "must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, not {role!r}")
        if isinstance(content, list):  # content parts: only text can reach a language model
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):  # fmt: skip
                raise bad(f"{where}.content", "only text parts ({type: text, text}) are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"{where}.content", "must be a string or a list of text parts")
        found.append((str(role), text(content, f"{where}.content")))
    return tuple(found)


def prompt(value: Any, field: str = "prompt") -> str | tuple[int, ...]:
    """A prompt: text, or token ids (OpenAI's completions take both); one prompt per request."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return text(value, field)
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if any(t < 0 for t in value):
            raise bad(field, "token ids are not negative")
        return tuple(value)
    raise bad(field, "must be a string or a list of token ids (one prompt per request)")


__all__ = [
    "SEED_MAX",
    "TOP_K_MAX",
    "GenerationCall",
    "Operation",
    "bad",
    "messages",
    "optional_bool",
    "optional_float",
    "optional_int",
    "prompt",
    "sampling",
    "stops",
    "text",
]
