"""Attacks on a device's generation endpoints through its local API (issue 32, rows 1 and 2 and the lone-surrogate
flood), tried from outside against a real agent process serving the converter's tinylm bundle (ONNX Runtime GenAI),
deployed over a real Mosquitto.

- Row 1: generation requests the runtime would fail on (`seed` >= 2^31, `top_k` above the vocabulary, temperature
  above 0) flooded for FLOOD_S seconds (EDGEFLEET_FLOOD_S; 15 by default, 60 in the figure docs/local-api.md gives)
  on all four generation endpoints: each is a 400, none counts as a model failure, the device keeps serving its
  bundle (no rollback), and the agent's log grows by fewer than 100 lines.
- Row 1 from a browser: another origin's page in headless Chromium sends 30 no-cors fetches (a JSON string, sent as
  text/plain, and a Blob without a type) to the agent: each is refused (403) before it reaches the model; and a
  request whose Host is another name (DNS rebinding) is refused.
- Row 2: connections that send a generation request's head and one byte of its body hold no generation slot: valid
  generations are all answered while they trickle.
- Partly: prompts holding lone surrogates are each a 400 in the one error form, and write no traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.attacks.ledger import AttackLedger
from support.dashboard import CHROMIUM_ARGS, chromium
from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.models.generative import TinylmBundles
from support.servers.brokers import MosquittoBroker, free_port
from support.slots import slot_of

pytestmark = pytest.mark.slow

DEVICE, LM = "dev-lm-api", "tinylm"
FLOOD_S = float(os.environ.get("EDGEFLEET_FLOOD_S", "15"))
GENERATE = f"/v2/models/{LM}/generate"
INVALID = [  # what the runtime would fail on: each made a 500 and a model failure before
    ("/v1/completions", {"model": LM, "prompt": "def", "temperature": 0.8, "seed": 2**31, "max_tokens": 4}),
    ("/v1/completions", {"model": LM, "prompt": "def", "temperature": 0.8, "top_k": 1025, "max_tokens": 4}),
    ("/v1/chat/completions", {"model": LM, "messages": [{"role": "user", "content": "hi"}], "seed": 2**63}),
    (GENERATE, {"text_input": "def", "parameters": {"temperature": 0.7, "top_k": 100_000, "max_tokens": 4}}),
    (f"{GENERATE}_stream", {"text_input": "def", "parameters": {"temperature": 0.7, "random_seed": 2**40}}),
]


@dataclass
class Agent:
    port: int
    process: AgentProcess
    watcher: FleetWatcher
    bundle_id: str

    def post(self, path: str, document: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            body = json.dumps(document).encode()
            conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def metric(self, name: str, **labels: str) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            page = conn.getresponse().read().decode()
        finally:
            conn.close()
        return sum(
            sample.value for family in text_string_to_metric_families(page) for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )  # fmt: skip

    def healthy(self) -> bool:
        """Still serving the bundle it was given, with no rollback and no model failure counted."""
        status = self.watcher.status.get(DEVICE)
        rolled = [e for e in self.watcher.events if e.device_id == DEVICE and "roll" in e.kind]
        return bool(status and slot_of(status).active_bundle == self.bundle_id and not rolled) and self.failures() == 0

    def failures(self) -> float:
        return self.metric("edgefleet_model_failures_total")

    def log_lines(self) -> int:
        return len(self.process.log().splitlines())


@pytest.fixture(scope="module")
def agent(
    mosquitto: MosquittoBroker, keys: tuple[Path, Path], tinylm_bundles: TinylmBundles,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Agent]:  # fmt: skip
    root = tmp_path_factory.mktemp("lm-api-attacks")
    host = Connection(mosquitto.url, f"{DEVICE}-host", protocol="auto").start()
    watcher = FleetWatcher(host, Topics())
    port = free_port()
    process = AgentProcess(DEVICE, root / DEVICE, broker=mosquitto.url, trust=keys[0].parent / "root.pub",
                           profile="generic-x86-64", extra=("--http-port", str(port))).start()  # fmt: skip
    try:
        bundle_id = deploy_to(host, Topics(), tinylm_bundles["generic-x86-64"], devices=(DEVICE,))
        watcher.serving(DEVICE, bundle_id, timeout=180)
        served = Agent(port, process, watcher, bundle_id)
        status, answer = served.post(GENERATE, {"text_input": "def", "parameters": {"max_tokens": 4}})
        assert status == 200, answer
        yield served
    finally:
        process.stop()
        host.stop()


def _valid(agent: Agent) -> int:
    return agent.post("/v1/completions", {"model": LM, "prompt": "def main", "max_tokens": 4, "temperature": 0.5,
                                          "seed": 2**31 - 1, "top_k": 1024})[0]  # fmt: skip


def test_a_flood_of_parameters_the_runtime_would_fail_on_leaves_the_device_healthy(
    agent: Agent, attack_ledger: AttackLedger
) -> None:
    lines_before = agent.log_lines()
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + FLOOD_S

    def flood() -> None:
        index = 0
        while time.monotonic() < deadline:
            path, document = INVALID[index % len(INVALID)]
            status, _ = agent.post(path, document)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
            index += 1

    threads = [threading.Thread(target=flood) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FLOOD_S + 60)
    time.sleep(2.5)  # two telemetry intervals: a health judgement would have run on the flood's counts
    grew = agent.log_lines() - lines_before
    sent = sum(statuses.values())
    healthy, valid = agent.healthy(), _valid(agent)
    detail = (f"{sent} requests in {FLOOD_S:g} s, statuses {statuses}; model failures {agent.failures():g}, "
              f"healthy {healthy}, a valid sampled request {valid}; the log grew {grew} lines")  # fmt: skip
    succeeded = set(statuses) != {400} or not healthy or valid != 200 or grew >= 100
    assert not attack_ledger.record("local API: generation flood, seed >= 2^31 / top_k > vocabulary (row 1)", succeeded,
                                    detail)  # fmt: skip
    assert sent > 0


class _AttackerPage(BaseHTTPRequestHandler):
    """Another origin's page: it only has to exist for the browser to run its script there."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>attacker</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


NO_CORS = """async ([base, count]) => {
    const body = JSON.stringify({model: "tinylm", prompt: "def", temperature: 0.8, seed: 2 ** 31, max_tokens: 4});
    const sent = [];
    for (let i = 0; i < count; i++) {
        const path = i % 2 ? "/v1/completions" : "/v2/models/tinylm/generate";
        const payload = i % 3 ? body : new Blob([body]);  // a string goes as text/plain, a Blob with no type as none
        sent.push(fetch(base + path, {method: "POST", mode: "no-cors", body: payload}).then(() => 1, () => 0));
    }
    return (await Promise.all(sent)).length;
}"""


def test_another_origins_page_and_a_rebound_name_cannot_reach_the_model(
    agent: Agent, attack_ledger: AttackLedger
) -> None:
    from playwright.sync_api import sync_playwright

    server = ThreadingHTTPServer(("127.0.0.1", 0), _AttackerPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    refused_before = agent.metric("edgefleet_errors_total", kind="forbidden")
    generated_before = agent.metric("gen_ai_client_token_usage_count")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            sent = page.evaluate(NO_CORS, [f"http://127.0.0.1:{agent.port}", 30])
            browser.close()
    finally:
        server.shutdown()
    deadline = time.monotonic() + 10  # the fetches are answered before they resolve; allow for a slow scrape
    while (
        agent.metric("edgefleet_errors_total", kind="forbidden") - refused_before < 30 and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    refused = agent.metric("edgefleet_errors_total", kind="forbidden") - refused_before
    generated = agent.metric("gen_ai_client_token_usage_count") - generated_before
    detail = f"{sent} no-cors fetches from another origin: {refused:g} refused (403), {generated:g} generations ran"
    assert not attack_ledger.record("local API: another origin's page sends no-cors generation requests (row 1)",
                                    refused < 30 or generated != 0 or agent.failures() != 0, detail)  # fmt: skip

    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
    conn.request("POST", GENERATE, json.dumps({"text_input": "def"}),
                 {"Host": f"rebind.attacker.example:{agent.port}", "Content-Type": "application/json"})  # fmt: skip
    status = conn.getresponse().status
    conn.close()
    assert not attack_ledger.record("local API: DNS rebinding (a Host the agent does not serve)", status != 403,
                                    f"Host rebind.attacker.example: {status}")  # fmt: skip


def test_connections_that_trickle_a_generation_body_hold_no_slot(agent: Agent, attack_ledger: AttackLedger) -> None:
    body = json.dumps({"text_input": "def", "parameters": {"max_tokens": 4}}).encode()
    head = (f"POST {GENERATE} HTTP/1.1\r\nHost: 127.0.0.1:{agent.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:1]  # fmt: skip
    stop = threading.Event()

    def trickle() -> None:  # what the attacker did: a head and one byte, again whenever the agent closes it
        while not stop.is_set():
            with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
                sock.sendall(head)
                sock.settimeout(0.5)
                while not stop.is_set():
                    try:
                        if not sock.recv(4096):
                            break  # closed (the body deadline): connect again
                    except TimeoutError:
                        continue
                    except OSError:
                        break

    trickling = [threading.Thread(target=trickle) for _ in range(8)]  # twice the gate's 2 running + 2 waiting
    for thread in trickling:
        thread.start()
    try:
        time.sleep(1.0)
        statuses = [agent.post(GENERATE, {"text_input": "def", "parameters": {"max_tokens": 4}})[0] for _ in range(15)]
    finally:
        stop.set()
        for thread in trickling:
            thread.join(10)
    answered = statuses.count(200)
    assert not attack_ledger.record("local API: connections trickling a generation body hold every slot (row 2)",
                                    answered != len(statuses), f"{answered} of {len(statuses)} valid generations "
                                    "answered while 8 connections trickled their bodies")  # fmt: skip


def test_lone_surrogates_are_refused_in_one_form_without_a_traceback(agent: Agent, attack_ledger: AttackLedger) -> None:
    log_before = agent.process.log()
    cases = [
        ("/v1/completions", {"model": LM, "prompt": "a\ud800b"}),
        ("/v1/chat/completions", {"model": LM, "messages": [{"role": "user", "content": "\udfff"}]}),
        (GENERATE, {"text_input": "x\udc00"}),
        (f"{GENERATE}_stream", {"text_input": "ok", "parameters": {"stop": ["\ud801"]}}),
    ]
    answers = [agent.post(path, document) for path, document in cases * 10]
    new_log = agent.process.log()[len(log_before) :]
    shapes = {type(json.loads(body).get("error")).__name__ for status, body in answers if status == 400}
    statuses = {status for status, _ in answers}
    detail = f"statuses {statuses}, error forms {shapes}, tracebacks {new_log.count('Traceback')}"
    succeeded = statuses != {400} or "Traceback" in new_log or agent.failures() != 0
    assert not attack_ledger.record("local API: prompts with lone surrogates (a 500 and a traceback each before)",
                                    succeeded, detail)  # fmt: skip
