"""Property tests of every local-API endpoint, as an attacker would fuzz them (issue 32, item 10): one service serving
the digits CNN and the converter's tinylm bundle (ONNX Runtime GenAI), over real HTTP, with arbitrary parameters on
the Open Inference Protocol's infer, /v1 infer, OpenAI's completions and chat, and Triton's generate and
generate_stream. Whatever is sent:

- the answer is never a 5xx (every refusal is a 4xx, or a 503 only for a full service, which these never fill);
- nothing counts as a model failure (the service's `on_failure`, the failures metric, the generation accounting);
- nothing holds a place past its request: once the answer is read, no request is queued or running, no generation
  is admitted at the gate.

Bounded (at most 60 examples a test, no deadline: a loaded 2-core machine), so they run in CI.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefleet.agent.api import GenerationConfig, GenerationParts, InferenceService, ServiceConfig
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.telemetry import RequestStats

from support.models.generative import TinylmBundles
from support.runtime import unpack

pytestmark = pytest.mark.slow  # the session's tinylm conversion (about a minute) comes first

LM, CNN = "tinylm", "digits-cnn"
SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

lone_surrogate = st.builds(lambda a, b: f"{a}\ud800{b}", st.text(max_size=4), st.text(max_size=4))
texts = st.text(max_size=40) | lone_surrogate | st.sampled_from(["", "def main(args):\n", "\x00", "\ufeff"])
ints = st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([0, 1, 1024, 1025, 2**31 - 1, 2**31, 2**63])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1e-300, 0.5, 1.0, 2.0, 2.5])
scalars = st.none() | st.booleans() | ints | floats | texts
json_values: Any = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
token_ids = st.lists(ints, min_size=0, max_size=6)
sampling = {
    "max_tokens": ints | json_values, "temperature": floats | json_values, "top_p": floats | json_values,
    "top_k": ints | json_values, "seed": ints | json_values, "stop": texts | st.lists(texts, max_size=5) | json_values,
    "stream": st.booleans() | json_values, "ignore_eos": st.booleans() | json_values,
}  # fmt: skip
message = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values,
                  "content": texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                              max_size=2) | json_values},
)  # fmt: skip
completion = st.fixed_dictionaries(
    {"model": st.just(LM) | st.just(CNN) | json_values},
    optional={"prompt": texts | token_ids | json_values, "n": ints | json_values, "logprobs": json_values,
              "stream_options": json_values, **sampling},
)  # fmt: skip
chat = st.fixed_dictionaries(
    {"model": st.just(LM) | json_values},
    optional={"messages": st.lists(message, max_size=3) | json_values, "max_completion_tokens": ints | json_values,
              **sampling},
)  # fmt: skip
triton = st.fixed_dictionaries(
    {}, optional={"text_input": texts | json_values, "parameters": st.fixed_dictionaries({}, optional=sampling)
                  | json_values, "id": texts | json_values, "random_seed": ints, "stop_words": json_values, **sampling},
)  # fmt: skip
tensor = st.fixed_dictionaries(
    {}, optional={"name": st.just("input") | texts, "datatype": st.sampled_from(["FP32", "FP64", "INT64", "BYTES"])
                  | json_values, "shape": st.lists(ints, max_size=4) | json_values,
                  "data": st.lists(floats | ints, max_size=70) | json_values, "parameters": json_values},
)  # fmt: skip
oip = st.fixed_dictionaries(
    {}, optional={"inputs": st.lists(tensor, max_size=2) | json_values, "outputs": json_values, "id": texts | ints,
                  "parameters": json_values},
)  # fmt: skip
v1 = st.fixed_dictionaries(
    {}, optional={"inputs": st.dictionaries(st.just("input") | texts, st.fixed_dictionaries(
        {}, optional={"dtype": st.sampled_from(["float32", "float64", "str", "object"]) | json_values,
                      "shape": st.lists(ints, max_size=4) | json_values, "data": st.lists(floats, max_size=70)
                      | json_values}), max_size=2) | json_values},
)  # fmt: skip
headers = st.fixed_dictionaries(
    {"Content-Type": st.sampled_from(["application/json", "application/json; charset=utf-8"])},
    optional={"Accept": st.sampled_from(["application/json", "*/*", "application/x-npy", "text/plain"]),
              "Inference-Header-Content-Length": st.sampled_from(["0", "5", "99999", "-1", "x"])},
)  # fmt: skip


@dataclass
class Served:
    service: InferenceService
    parts: GenerationParts
    failures: list[int]


@pytest.fixture(scope="module")
def served(
    tinylm_bundles: TinylmBundles, demo_bundles: dict[str, Path], keys: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:  # fmt: skip
    root = tmp_path_factory.mktemp("api-properties")
    lm = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], root / "lm"), 1)
    cnn = LoadedModel(*unpack(demo_bundles["generic-x86-64"], keys[1], root / "cnn"), 1)
    metrics, failures = ServiceMetrics(), []
    parts = GenerationParts.build(GenerationConfig(max_tokens=4), RequestStats(), metrics)
    service = InferenceService(
        [lm, cnn], ServiceConfig(port=0), metrics, on_failure=lambda: failures.append(1), generation=parts
    ).start()
    yield Served(service, parts, failures)
    service.stop()
    lm.close()
    cnn.close()


def _post(served: Served, path: str, body: bytes, extra: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", served.service.port, timeout=60)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(extra or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _holds(served: Served, path: str, document: Any, extra: dict[str, str] | None = None) -> None:
    body = json.dumps(document).encode()  # ensure_ascii: a lone surrogate travels as its \\ud800 escape
    status, answer = _post(served, path, body, extra)
    assert status < 500, (status, answer[:300], document)
    metrics, gate = served.service.metrics, served.parts.gate
    assert served.failures == [] and not dict(metrics.failures.items()), document
    assert metrics.queue_depth() == 0 and metrics.in_flight() == 0, document
    assert gate.running == 0 and gate.waiting == 0, document


@SETTINGS
@given(document=completion)
def test_openai_completions_never_fail_the_model_nor_hold_a_slot(served: Served, document: dict[str, Any]) -> None:
    _holds(served, "/v1/completions", document)


@SETTINGS
@given(document=chat)
def test_openai_chat_never_fails_the_model_nor_holds_a_slot(served: Served, document: dict[str, Any]) -> None:
    _holds(served, "/v1/chat/completions", document)


@SETTINGS
@given(document=triton, stream=st.booleans())
def test_triton_generate_never_fails_the_model_nor_holds_a_slot(
    served: Served, document: dict[str, Any], stream: bool
) -> None:
    _holds(served, f"/v2/models/{LM}/generate" + ("_stream" if stream else ""), document)


@SETTINGS
@given(document=oip, extra=headers, model=st.sampled_from([CNN, LM]))
def test_oip_infer_never_fails_the_model_nor_holds_a_slot(
    served: Served, document: dict[str, Any], extra: dict[str, str], model: str
) -> None:
    _holds(served, f"/v2/models/{model}/infer", document, extra)


@SETTINGS
@given(document=v1, extra=headers)
def test_v1_infer_never_fails_the_model_nor_holds_a_slot(
    served: Served, document: dict[str, Any], extra: dict[str, str]
) -> None:
    _holds(served, f"/v1/models/{CNN}/infer", document, extra)


@SETTINGS
@given(body=st.binary(max_size=300), path=st.sampled_from([
    "/v1/completions", "/v1/chat/completions", f"/v2/models/{LM}/generate", f"/v2/models/{LM}/generate_stream",
    f"/v2/models/{CNN}/infer", f"/v1/models/{CNN}/infer", f"/v2/models/{CNN}/feedback",
]))  # fmt: skip
def test_arbitrary_bytes_on_every_post_endpoint_are_refused_not_failed(served: Served, body: bytes, path: str) -> None:
    status, answer = _post(served, path, body)
    assert status < 500, (status, answer[:300], body)
    assert served.failures == [] and served.parts.gate.waiting == 0 and served.service.metrics.in_flight() == 0


def test_a_valid_sampled_generation_is_still_served(served: Served) -> None:
    """The checks refuse what the runtime would fail on, not what it serves: the largest seed and top_k it takes."""
    for path, document in (
        ("/v1/completions", {"model": LM, "prompt": "def", "temperature": 0.8, "top_k": 1024, "seed": 2**31 - 1}),
        (f"/v2/models/{LM}/generate", {"text_input": "def", "parameters": {"temperature": 1.0, "top_p": 0.5}}),
    ):
        status, answer = _post(served, path, json.dumps(document).encode())
        assert status == 200, answer
