"""The local API serving a generative bundle (the converter's signed tinylm bundle on ONNX Runtime GenAI), in
process: OpenAI's completions and chat through the official `openai` client, Triton's generate and generate_stream
over raw HTTP (tritonclient's HTTP client has no generate call: http.client and a socket read the answers), token
budgets, a full gate, a client that leaves mid-stream, the drain on a swap, and the figures on /metrics and in the
telemetry window."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgefleet.agent.api import GenerationConfig, GenerationParts, InferenceService, ServiceConfig
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.telemetry import RequestStats

from support.generation import SlowSession, post, sse_events
from support.models.generative import TinylmBundles
from support.runtime import unpack

pytestmark = pytest.mark.slow  # the session's tinylm conversion (about a minute) comes first

NAME = "tinylm"
PROMPT = "def main(args):\n    "


@pytest.fixture(scope="module")
def loaded(
    tinylm_bundles: TinylmBundles, keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[LoadedModel]]:
    root = tmp_path_factory.mktemp("generation-api")
    models = [LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], root / str(i)), 2) for i in range(2)]
    yield models
    for model in models:
        model.close()


@pytest.fixture
def served(loaded: list[LoadedModel]) -> Iterator[tuple[InferenceService, RequestStats]]:
    stats = RequestStats()
    parts = GenerationParts.standalone(GenerationConfig(concurrency=1, queue=1, queue_timeout_s=1.0, max_tokens=48),
                                       stats)  # fmt: skip
    service = InferenceService([loaded[0]], ServiceConfig(port=0), generation=parts).start()
    yield service, stats
    service.stop()


def client(service: InferenceService) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{service.port}/v1", api_key="unused", max_retries=0)


def test_the_openai_client_streams_a_completion_and_a_chat_answer(
    served: tuple[InferenceService, RequestStats],
) -> None:
    service, stats = served
    api = client(service)
    assert [m.id for m in api.models.list()] == [NAME]
    assert api.models.retrieve(NAME).owned_by == "edgefleet"
    whole = api.completions.create(model=NAME, prompt=PROMPT, max_tokens=20)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens <= 20 and whole.usage.prompt_tokens > 0
    chunks = list(api.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, stream=True,
                                         stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text  # greedy: the same text
    assert chunks[-1].usage == whole.usage and len(chunks) > 3
    chat = api.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "write a loop"}], max_tokens=12
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage is not None
    streamed = list(api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "write a loop"}],
                                                max_tokens=12, stream=True))  # fmt: skip
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content
    assert streamed[-1].choices[0].finish_reason == chat.choices[0].finish_reason
    window = stats.generation.snapshot()
    assert window.streams == 4 and window.refused == 0 and window.output_tokens > 0
    assert window.ttft is not None and window.tpot is not None and window.tokens_per_s


def test_triton_generate_and_generate_stream_give_the_same_text(served: tuple[InferenceService, RequestStats]) -> None:
    service, _ = served
    request = {"text_input": PROMPT, "parameters": {"max_tokens": 16}, "id": "r1"}
    status, headers, body = post(service.port, f"/v2/models/{NAME}/generate", request)
    answer = json.loads(body)
    assert status == 200 and answer["id"] == "r1" and answer["model_name"] == NAME
    assert answer["usage"]["completion_tokens"] <= 16
    status, headers, body = post(service.port, f"/v2/models/{NAME}/generate_stream", request)
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert headers["content-type"].startswith("text/event-stream")
    events = sse_events(body)
    assert "".join(e["text_output"] for e in events) == answer["text_output"]
    assert events[-1]["finish_reason"] == answer["finish_reason"] and events[-1]["usage"] == answer["usage"]
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)  # one connection, stream then more
    for path in ("generate_stream", "generate", "generate_stream"):
        conn.request("POST", f"/v2/models/{NAME}/{path}", json.dumps(request))
        response = conn.getresponse()
        assert response.status == 200 and response.read()
    conn.close()
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:  # HTTP/1.0: no chunks
        body = json.dumps(request).encode()
        sock.sendall(b"POST /v2/models/%b/generate_stream HTTP/1.0\r\nContent-Length: %d\r\n\r\n%b"
                     % (NAME.encode(), len(body), body))  # fmt: skip
        raw = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert "".join(e["text_output"] for e in sse_events(rest)) == answer["text_output"]


def test_budgets_and_the_body_cap_refuse_with_a_clear_reason(served: tuple[InferenceService, RequestStats]) -> None:
    service, stats = served
    long_prompt = "x = 1\n" * 200  # well over the 256-token context
    status, _, body = post(service.port, f"/v2/models/{NAME}/generate_stream", {"text_input": long_prompt})
    assert status == 400 and "context holds 256 tokens" in json.loads(body)["error"]
    with pytest.raises(openai.BadRequestError, match="shorten the prompt"):
        client(service).completions.create(model=NAME, prompt=long_prompt, stream=True)
    capped = client(service).completions.create(model=NAME, prompt=PROMPT, max_tokens=500, temperature=0.8, seed=1)
    assert capped.usage is not None and capped.usage.completion_tokens <= 48  # the agent's cap
    status, _, body = post(service.port, f"/v2/models/{NAME}/generate", {"text_input": "y" * 300_000})
    assert status == 413
    with pytest.raises(openai.NotFoundError):
        client(service).completions.create(model="nobody", prompt=PROMPT)
    status, _, _ = post(service.port, f"/v2/models/{NAME}/infer", {"inputs": []})
    assert status == 400
    assert stats.generation.snapshot().refused == 4  # two budgets, the body, the unknown model


def test_a_full_gate_is_a_503_with_retry_after_until_a_slot_frees(
    served: tuple[InferenceService, RequestStats],
) -> None:
    service, stats = served
    gate = service.generation.gate
    running, waiting = gate.enter(), gate.enter()  # concurrency 1 + queue 1, taken
    running.wait()
    try:
        status, headers, body = post(service.port, f"/v2/models/{NAME}/generate_stream", {"text_input": PROMPT})
        assert status == 503 and headers["retry-after"] == "1" and "retry later" in json.loads(body)["error"]
        with pytest.raises(openai.APIStatusError) as refused:
            client(service).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 503
    finally:
        waiting.release()
    status, _, body = post(service.port, f"/v2/models/{NAME}/generate", {"text_input": PROMPT})
    assert status == 503 and "no generation place within 1 s" in json.loads(body)["error"]  # queued, then timed out
    running.release()
    assert post(service.port, f"/v2/models/{NAME}/generate", {"text_input": PROMPT})[0] == 200
    assert stats.generation.snapshot().refused == 3
    page, _ = service.render_metrics()
    assert 'edgefleet_generations_refused_total{reason="overloaded"} 2.0' in page.decode()


def test_a_client_that_leaves_mid_stream_stops_its_generation(
    served: tuple[InferenceService, RequestStats], loaded: list[LoadedModel]
) -> None:
    service, stats = served
    generative = loaded[0].generative
    assert generative is not None
    inner = generative.session
    generative.session = SlowSession(inner, 0.05)
    try:
        body = json.dumps({"text_input": PROMPT, "parameters": {"max_tokens": 40, "temperature": 0}}).encode()
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/%b/generate_stream HTTP/1.1\r\nHost: [::1]\r\nContent-Length: %d\r\n\r\n%b"
                         % (NAME.encode(), len(body), body))  # fmt: skip
            seen = b""
            while b"data: " not in seen:  # the head, then the first event
                seen += sock.recv(65536)
        deadline = time.monotonic() + 10
        while generative.active and time.monotonic() < deadline:
            time.sleep(0.05)
        window = stats.generation.snapshot()
        assert window.cut == 1 and window.streams == 1 and window.output_tokens < 40
        assert service.generation.gate.running == 0
    finally:
        generative.session = inner


def test_a_swap_drains_streams_in_flight_and_cuts_only_what_outlives_the_drain(
    served: tuple[InferenceService, RequestStats], loaded: list[LoadedModel], tmp_path: Path,
    tinylm_bundles: TinylmBundles, keys: tuple[Path, Path],
) -> None:  # fmt: skip
    service, stats = served
    old = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path / "old"), 2)
    service.swap(old)
    assert old.generative is not None
    slow = SlowSession(old.generative.session, 0.02)
    old.generative.session = slow
    found: dict[str, list[object]] = {}

    def stream(label: str, tokens: int) -> None:
        request = {"text_input": PROMPT, "parameters": {"max_tokens": tokens}}
        found[label] = sse_events(post(service.port, f"/v2/models/{NAME}/generate_stream", request)[2])

    first = threading.Thread(target=stream, args=("drained", 12))  # ~0.25 s of a 5 s drain
    first.start()
    assert slow.started.wait(10)
    service.swap(loaded[0])  # new requests go to the new model at once; the old one drains, as the agent retires it
    assert old.drain(5.0) == 0
    first.join(10)
    assert "finish_reason" in found["drained"][-1]  # finished whole
    old.close()

    old = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path / "old2"), 2)
    service.swap(old)
    assert old.generative is not None
    slow = SlowSession(old.generative.session, 0.05)
    old.generative.session = slow
    second = threading.Thread(target=stream, args=("cut", 48))  # ~2.4 s: outlives a 0.2 s drain
    second.start()
    assert slow.started.wait(10)
    service.swap(loaded[0])
    assert post(service.port, f"/v2/models/{NAME}/generate", {"text_input": PROMPT})[0] == 503  # the one slot is busy
    assert old.drain(0.2) == 1
    second.join(10)
    assert "generation cut" in found["cut"][-1]["error"] and "drain ran out" in found["cut"][-1]["error"]
    old.close()
    window = stats.generation.snapshot()
    assert window.cut == 1 and window.streams == 2


def test_the_metrics_page_has_the_gen_ai_families(served: tuple[InferenceService, RequestStats]) -> None:
    service, stats = served
    client(service).completions.create(model=NAME, prompt=PROMPT, max_tokens=10)
    client(service).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    page, _ = service.render_metrics()
    families = {f.name: f for f in text_string_to_metric_families(page.decode())}
    for name in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
                 "gen_ai_client_token_usage"):  # fmt: skip
        assert families[name].type == "histogram"
    usage = [s for s in families["gen_ai_client_token_usage"].samples if s.name.endswith("_sum")]
    kinds = {(s.labels["gen_ai_operation_name"], s.labels["gen_ai_token_type"]) for s in usage}
    assert kinds == {("text_completion", "input"), ("text_completion", "output"), ("chat", "input"), ("chat", "output")}
    assert all(
        s.labels["gen_ai_request_model"] == NAME and s.labels["gen_ai_provider_name"] == "edgefleet" for s in usage
    )
    openmetrics, _ = service.render_metrics("application/openmetrics-text")
    assert b"gen_ai_server_time_to_first_token_seconds_bucket" in openmetrics
    latency, requests, _, _ = stats.snapshot()  # a generative model's request latency is its time per output token
    window = stats.generation.snapshot()
    assert requests == 2 and latency.p50_ms is not None and window.tpot is not None
    assert latency.p50_ms == pytest.approx(window.tpot.p50_ms, rel=0.01)
