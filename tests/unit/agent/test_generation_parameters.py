"""The generation parameters every endpoint takes, checked against what both runtimes accept before a request reaches
one (agent/api/generation/call.py): what ONNX Runtime GenAI or OpenVINO GenAI would fail on (a seed of 2^31, top_p 0
when sampling, text that is not Unicode) is a 400 naming the field, on OpenAI's, Triton's and MQTT's parsers alike;
the largest values they take pass. (Measured on tinylm with both runtimes: a seed of 2^31 and top_k above the
vocabulary fail in ORT GenAI, top_p 0 in OpenVINO GenAI, an empty prompt and a lone surrogate in both.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation import openai_api, triton_api
from edgefleet.agent.api.generation.call import SEED_MAX

SURROGATE = "a\ud800b"


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "tinylm", "prompt": "def", **fields}).encode()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"seed": 2**31, "temperature": 1.0}, "seed"),
        ({"seed": 2**64}, "seed"),  # refused whatever the temperature: the same request is taken or not, always
        ({"seed": -1}, "seed"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0, "temperature": 0.7}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": 2.5}, "temperature"),
        ({"prompt": SURROGATE}, "prompt"),
        ({"stop": [SURROGATE]}, "stop"),
        ({"model": SURROGATE}, "model"),
        ({"model": "x" * 65}, "model"),
        ({"prompt": [-1]}, "prompt"),
    ],
)
def test_what_a_runtime_would_fail_on_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as caught:
        openai_api.parse_completion(completion(**fields))
    assert caught.value.status == 400 and caught.value.message.startswith(field), caught.value.message


def test_the_largest_values_the_runtimes_take_pass() -> None:
    call = openai_api.parse_completion(completion(seed=SEED_MAX, temperature=2.0, top_p=1.0, top_k=1024))
    assert call.sampling is not None and call.sampling.seed == 2**31 - 1 and call.sampling.top_k == 1024
    assert openai_api.parse_completion(completion(top_p=0.0)).sampling is None  # greedy: top_p is not used


def test_lone_surrogates_are_refused_wherever_text_goes() -> None:
    chat = {"model": "tinylm", "messages": [{"role": "user", "content": SURROGATE}]}
    with pytest.raises(RequestError, match=r"messages\[0\]\.content: is not valid Unicode"):
        openai_api.parse_chat(json.dumps(chat).encode())
    for document, field in (({"text_input": SURROGATE}, "text_input"), ({"text_input": "x", "id": SURROGATE}, "id"),
                            ({"text_input": "x", "parameters": {"stop": SURROGATE}}, "stop")):  # fmt: skip
        with pytest.raises(RequestError, match=f"^{field}: is not valid Unicode"):
            triton_api.parse(json.dumps(document).encode(), "tinylm")
    # a surrogate pair is one valid character (U+1F600), escaped the way JSON writes it
    assert triton_api.parse(b'{"text_input": "\\ud83d\\ude00"}', "tinylm").prompt == "\U0001f600"
