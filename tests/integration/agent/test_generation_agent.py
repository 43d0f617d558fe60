"""A real agent process serving a generative bundle, on a real Mosquitto: the converter's signed tinylm bundle
installed through the normal path (verify, stage, load, golden prompts, commit), answered on the local API with the
official `openai` client and over MQTT with streamed chunks, reported in telemetry (token figures, TPOT as the
request latency, next-token agreement as the golden agreement); then a re-signed build with damaged weights is
refused by its golden prompts and nothing changes on the device."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from edgefleet.core.generation_messages import GenerateChunk, GenerateRequest
from edgefleet.core.messages import Telemetry, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.generation import corrupted_bundle
from support.models.generative import TinylmBundles
from support.servers.brokers import free_port
from support.slots import slot_of

pytestmark = pytest.mark.slow

DEVICE = "gen-1"
PROMPT = "import os\n\n\nclass "


def generate(host: Connection, topics: Topics, request: GenerateRequest, timeout: float = 30) -> list[GenerateChunk]:
    """Send a generation request over MQTT and collect its chunks up to the last one."""
    chunks: queue.Queue[GenerateChunk] = queue.Queue()
    topic = topics.generate_response(DEVICE, request.client_id)
    host.subscribe(topic, lambda _t, payload, _r: chunks.put(decode(GenerateChunk, payload)))
    time.sleep(0.2)  # the subscription is in place before the request can be answered
    host.publish(topics.generate_request(DEVICE), request.encode(), qos=1)
    found: list[GenerateChunk] = []
    deadline = time.monotonic() + timeout
    while not (found and found[-1].done):
        found.append(chunks.get(timeout=max(0.1, deadline - time.monotonic())))
    host.unsubscribe(topic)
    return found


def test_an_agent_installs_a_generative_bundle_and_serves_it_over_http_and_mqtt(
    tinylm_bundles: TinylmBundles, start_agent: Callable[..., AgentProcess], host: Connection, topics: Topics,
    watcher: FleetWatcher, signing_key: SigningKey, trusted: TrustedKeys, tmp_path: Path,
) -> None:  # fmt: skip
    port = free_port()
    start_agent(DEVICE, extra=("--http-port", str(port), "--generation-concurrency", "1", "--drain", "5"))
    bundle_id = deploy_to(host, topics, tinylm_bundles["generic-x86-64"], devices=(DEVICE,))
    status = watcher.serving(DEVICE, bundle_id, timeout=120)
    slot = slot_of(status)
    assert slot.provider_in_use == "onnxruntime-genai:cpu" and "time per output token" in str(slot.provider_summary)

    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    whole = api.completions.create(model="tinylm", prompt=PROMPT, max_tokens=24)
    pieces = [c.choices[0].text for c in api.completions.create(model="tinylm", prompt=PROMPT, max_tokens=24,
                                                                  stream=True)]  # fmt: skip
    # Streamed: the first piece goes out at once, the rest joined for at most 2 ms each (agent/api/generation/
    # pacing.py), so how many pieces follow depends on this machine's decode speed; that the first came alone does not.
    text = whole.choices[0].text
    assert "".join(pieces) == text and len(pieces) >= 2 and len(pieces[0]) < len(text)

    chunks = generate(host, topics, GenerateRequest(request_id="m1", client_id="c1", prompt=PROMPT, max_tokens=24))
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert "".join(c.text for c in chunks) == whole.choices[0].text  # greedy, the same bundle: the same text
    last = chunks[-1]
    assert last.done and last.error is None and last.bundle_id == bundle_id and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens if whole.usage else False
    (one,) = generate(host, topics, GenerateRequest(request_id="m2", client_id="c1", prompt=PROMPT, max_tokens=8,
                                                    stream=False))  # fmt: skip
    assert one.done and whole.choices[0].text.startswith(one.text) and one.finish_reason == "length"
    (refused,) = generate(host, topics, GenerateRequest(request_id="m3", client_id="c1", prompt="x = 1\n" * 200))
    assert refused.done and refused.error is not None and "shorten the prompt" in refused.error

    def generating() -> Telemetry | None:
        for report in reversed(watcher.telemetry):
            if report.device_id == DEVICE and report.generation is not None and report.generation.streams:
                return report
        return None

    report = watcher.wait_for("telemetry with generations", generating, timeout=30)
    assert report.bundle_id == bundle_id and report.golden_agreement is not None
    assert report.golden_max_abs_error is None
    stats = report.generation
    assert stats is not None and stats.tpot is not None and stats.ttft is not None and stats.output_tokens > 0
    assert report.latency.p50_ms is not None and report.latency.p50_ms < 50  # TPOT in ms, not a whole answer
    assert {s.output for s in report.golden_scores} == {"next-token", "perplexity", "continuation"}

    def refusals() -> int:
        return sum(t.generation.refused for t in watcher.telemetry if t.device_id == DEVICE and t.generation)

    watcher.wait_for("the refusal in telemetry", refusals, timeout=30)

    broken = corrupted_bundle(tinylm_bundles["generic-x86-64"], tmp_path, signing_key, trusted, "2")
    broken_id = deploy_to(host, topics, broken, devices=(DEVICE,))
    event = watcher.event(DEVICE, "refused", timeout=120, bundle_id=broken_id)
    assert "golden prompts fail" in event.detail
    assert slot_of(watcher.status[DEVICE]).active_bundle == bundle_id  # nothing changed
    again = api.completions.create(model="tinylm", prompt=PROMPT, max_tokens=24)
    assert again.choices[0].text == whole.choices[0].text
