"""Local API abuse on a real agent process serving a real bundle, with an older bundle it could roll back to.

Each attack is recorded in the attack ledger. After each one the agent must answer a good request, its model
must not have failed once (telemetry `errors`, the runtime kind, /metrics' model failures), it must not have
judged the bundle unhealthy nor rolled back, and it must not have grown by the attack's size.
"""

from __future__ import annotations

import io
import json
import socket
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgefleet.core.messages import Telemetry
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.servers.brokers import MosquittoBroker, free_port
from support.slots import slot_of

DEVICE = "dev-abuse"
V2_INFER = "/v2/models/digits-cnn/infer"
V1_INFER = "/v1/models/digits-cnn/infer"


@dataclass
class Served:
    agent: AgentProcess
    port: int
    bundle_id: str
    older_id: str
    watcher: FleetWatcher

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def served(
    mosquitto: MosquittoBroker,
    keys: tuple[Path, Path],
    signing_key: SigningKey,
    demo_bundles: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """An agent serving digits-cnn v2 after v1: a health failure would roll it back to v1."""
    root = tmp_path_factory.mktemp("abuse")
    host = Connection(mosquitto.url, f"abuse-host-{root.name}", protocol="auto").start()
    watcher = FleetWatcher(host, Topics())
    port = free_port()
    agent = AgentProcess(
        DEVICE, root / DEVICE, broker=mosquitto.url, trust=keys[0].parent / "root.pub",
        extra=("--http-port", str(port), "--health-interval", "0.5"),
    ).start()  # fmt: skip
    try:
        v1 = demo_bundles["intel-x86-vnni"]
        v2 = derive_bundle(v1, root, signing_key, TrustedKeys.load([keys[1]]), model_version="2")
        v1_id = deploy_to(host, Topics(), v1, devices=(DEVICE,))
        watcher.serving(DEVICE, v1_id, timeout=60)
        v2_id = deploy_to(host, Topics(), v2, devices=(DEVICE,))
        watcher.serving(DEVICE, v2_id, timeout=60)
        yield Served(agent, port, v2_id, v1_id, watcher)
    finally:
        agent.stop()
        host.stop()


def post(served: Served, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(served.url(path), body, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def good_request(served: Served) -> dict:
    x = np.zeros((1, 1, 8, 8), np.float32)
    document = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": x.ravel().tolist()}]}
    status, body = post(served, V2_INFER, json.dumps(document).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    return json.loads(body)


def metrics(served: Served) -> dict[str, float]:
    with urllib.request.urlopen(served.url("/metrics"), timeout=30) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def rss(served: Served) -> float:
    return metrics(served)["process_resident_memory_bytes"]


def assert_model_untouched(served: Served, since: float) -> str:
    """The model served, never failed, never judged unhealthy, never rolled back; returns a summary."""
    answer = good_request(served)
    assert answer["model_name"] == "digits-cnn"
    values = metrics(served)
    assert values['edgefleet_errors_total{kind="runtime"}'] == 0
    assert not [k for k, v in values.items() if k.startswith("edgefleet_model_failures_total") and v]
    watcher = served.watcher

    def later_reports() -> list[Telemetry] | None:
        reports = [t for t in watcher.telemetry if t.device_id == DEVICE and t.ts > since + 0.5]
        return reports if len(reports) >= 2 else None

    seen = watcher.wait_for("two telemetry reports after the attack", later_reports, timeout=60)
    reports = [t for t in watcher.telemetry if t.device_id == DEVICE]
    assert sum(t.errors for t in reports) == 0, "no request may count as a model failure"
    assert all(t.errors_by_kind.get("runtime", 0) == 0 for t in reports)
    bad = [e for e in watcher.events if e.device_id == DEVICE and e.kind in ("health-failed", "rolled-back")]
    assert not bad, [f"{e.kind}: {e.detail}" for e in bad]
    status = watcher.status[DEVICE]
    assert slot_of(status).active_bundle == served.bundle_id and status.online
    refused = seen[-1].errors_by_kind
    return f"model untouched; refusals so far {dict(sorted(refused.items()))}"


def test_deep_json_is_refused_as_bad_input_and_never_hurts_the_model(
    served: Served, attack_ledger: AttackLedger
) -> None:
    start = time.time()
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    deep_data = (
        b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": '
        + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    )  # fmt: skip
    statuses = []
    for _ in range(20):
        statuses.append(post(served, V2_INFER, deep, {"Content-Type": "application/json"})[0])
        statuses.append(post(served, V2_INFER, deep_data, {"Content-Type": "application/json"})[0])
        statuses.append(post(served, V1_INFER, deep, {"Content-Type": "application/json"})[0])
    status, body = post(served, V2_INFER, deep, {"Content-Type": "application/json"})
    assert status == 400 and b"nested 100001 deep" in body
    summary = assert_model_untouched(served, start)
    succeeded = set(statuses) != {400}
    attack_ledger.record("local API: JSON nested 100,000 deep (60 requests)", succeeded,
                         f"every one 400 before parsing; {summary}")  # fmt: skip
    assert not succeeded, statuses


def test_huge_shapes_are_refused_before_anything_is_allocated(served: Served, attack_ledger: AttackLedger) -> None:
    start = time.time()
    before = rss(served)
    huge = [2**40, 2**40, 2**40, 2**40]
    oip_binary = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": huge,
                                         "parameters": {"binary_data_size": 16}}]}).encode()  # fmt: skip
    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy, {"descr": "<f4", "fortran_order": False, "shape": (2**40, 2**40)})
    npy.write(b"\0" * 64)
    cases = {
        "OIP JSON, shape 2^160": (V2_INFER, json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                  "shape": huge, "data": []}]}).encode(), {"Content-Type": "application/json"}),
        "OIP binary, shape 2^160": (V2_INFER, oip_binary + b"\0" * 16,
                                    {"Content-Type": "application/octet-stream",
                                     "Inference-Header-Content-Length": str(len(oip_binary))}),
        "v1 JSON, shape 2^124 with no data": (V1_INFER, json.dumps({"inputs": {"input": {"dtype": "float32",
                                              "shape": [2**62, 2**62], "data": []}}}).encode(),
                                              {"Content-Type": "application/json"}),
        ".npy header claiming 2^80 floats": (V1_INFER, npy.getvalue(), {"Content-Type": "application/x-npy"}),
    }  # fmt: skip
    answers = {name: post(served, path, body, headers) for name, (path, body, headers) in cases.items()}
    grown_mb = (rss(served) - before) / 2**20
    summary = assert_model_untouched(served, start)
    refused = {name: status for name, (status, _) in answers.items()}
    succeeded = any(status not in (400, 413) for status in refused.values()) or grown_mb > 64
    attack_ledger.record("local API: huge shapes (2^80..2^160 elements)", succeeded,
                         f"{refused}; RSS grew {grown_mb:.1f} MB; {summary}")  # fmt: skip
    assert not succeeded, (answers, grown_mb)


def _npz_bomb(declared_bytes: int) -> bytes:
    """An .npz whose one member is a valid .npy of `declared_bytes` zeros, deflated to about a thousandth."""
    header = io.BytesIO()
    elements = (declared_bytes - 128) // 4
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("input.npy", "w", force_zip64=True) as member,
    ):
        member.write(header.getvalue())
        chunk = b"\0" * 2**22
        left = elements * 4
        while left:
            member.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
    return buffer.getvalue()


def test_an_npz_bomb_is_refused_before_it_is_decompressed(served: Served, attack_ledger: AttackLedger) -> None:
    start = time.time()
    bomb = _npz_bomb(2**30)
    assert len(bomb) < 8 * 2**20, "the bomb fits under the body limit"
    many = io.BytesIO()
    with zipfile.ZipFile(many, "w") as archive:
        for index in range(2000):
            archive.writestr(f"m{index}.npy", b"")
    before = rss(served)
    answers = [post(served, V1_INFER, bomb, {"Content-Type": "application/x-npz"}) for _ in range(5)]
    answers.append(post(served, V1_INFER, many.getvalue(), {"Content-Type": "application/x-npz"}))
    grown_mb = (rss(served) - before) / 2**20
    summary = assert_model_untouched(served, start)
    statuses = [status for status, _ in answers]
    assert b"unpacks to" in answers[0][1]
    succeeded = statuses != [413] * 5 + [400] or grown_mb > 64
    attack_ledger.record(f"local API: .npz bomb ({len(bomb) // 1024} KiB inflating to 1 GiB) ×5, 2,000 members",
                         succeeded, f"statuses {statuses}; RSS grew {grown_mb:.1f} MB; {summary}")  # fmt: skip
    assert not succeeded, (statuses, grown_mb)


@pytest.mark.slow
def test_500_slow_connections_neither_block_good_requests_nor_stay_open(
    served: Served, attack_ledger: AttackLedger
) -> None:
    start = time.time()
    slow: list[socket.socket] = []
    try:
        for index in range(500):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
            partial = f"POST {V2_INFER} HTTP/1.1\r\nHost: [::1]\r\nX-Slow-{index}: "
            sock.sendall(partial.encode())  # a head that never ends
            slow.append(sock)
        deadline = time.monotonic() + 60
        while metrics(served)["edgefleet_open_connections"] < 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        held = metrics(served)["edgefleet_open_connections"]
        for sock in slow[::10]:
            sock.sendall(b"x")  # still trickling
        began = time.monotonic()
        good_request(served)  # answered while 500 slow clients hold their connections
        answered_in = time.monotonic() - began
        closed = 0
        for sock in slow:  # the server gives up on each head after its header deadline
            sock.settimeout(60)
            try:
                closed += sock.recv(4096) == b""
            except OSError:
                closed += 1
    finally:
        for sock in slow:
            sock.close()
    summary = assert_model_untouched(served, start)
    values = metrics(served)
    timeouts = values.get('edgefleet_connections_closed_total{reason="header-timeout"}', 0)
    succeeded = held < 500 or closed != 500 or timeouts < 500
    attack_ledger.record("local API: 500 slow connections (slowloris)", succeeded,
                         f"{held:.0f} held open, a good request answered in {answered_in:.2f} s, "
                         f"{timeouts:.0f} closed at the header deadline; {summary}")  # fmt: skip
    assert not succeeded, (held, closed, timeouts)


def exchange(served: Served, data: bytes) -> tuple[list[bytes], bool]:
    """Send raw bytes on one connection; the status lines of every answer, and whether the server then closed it."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        closed = False
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            chunks.append(chunk)
    received = b"".join(chunks)
    return [line for line in received.split(b"\r\n") if line.startswith(b"HTTP/1.")], closed


SMUGGLED = b"POST /v2/repository/index HTTP/1.1\r\nHost: [::1]\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("duplicate Content-Length, conflicting", f"Content-Length: {len(SMUGGLED)}\r\nContent-Length: 0"),
        ("duplicate Content-Length, equal", f"Content-Length: {len(SMUGGLED)}\r\nContent-Length: {len(SMUGGLED)}"),
        ("Content-Length with Transfer-Encoding", f"Content-Length: {len(SMUGGLED)}\r\nTransfer-Encoding: chunked"),
        ("obsolete line folding hiding a Content-Length", f"X-Pad: a\r\n Content-Length: {len(SMUGGLED)}"),
    ],
)
def test_a_request_framed_two_ways_is_refused_and_never_yields_a_second_request(
    served: Served, attack_ledger: AttackLedger, name: str, head: str
) -> None:
    """The body of the first request is a whole second request: a lenient parser answers both (the old one did,
    for conflicting lengths). The agent answers one 400 and closes the connection."""
    start = time.time()
    document = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.0] * 64}]}
    body = json.dumps(document).encode()
    first = f"POST {V2_INFER} HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n{head}\r\n\r\n".encode()
    statuses, closed = exchange(served, first + SMUGGLED + body)
    summary = assert_model_untouched(served, start)
    succeeded = len(statuses) != 1 or not statuses[0].startswith(b"HTTP/1.1 400") or not closed
    said = [s.decode() for s in statuses]
    attack_ledger.record(f"local API: {name} (request smuggling)", succeeded,
                         f"answers {said}, connection closed {closed}; {summary}")  # fmt: skip
    assert not succeeded, (statuses, closed)


def test_nan_and_infinity_inputs_are_refused_and_never_answered_as_invalid_json(
    served: Served, attack_ledger: AttackLedger
) -> None:
    start = time.time()
    x = np.zeros((1, 1, 8, 8), np.float32)
    answers: dict[str, tuple[int, bytes]] = {}
    for label, value in (("NaN", np.nan), ("Infinity", np.inf), ("-Infinity", -np.inf)):
        x[0, 0, 0, 0] = value
        header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8],
                                         "parameters": {"binary_data_size": x.nbytes}}]}).encode()  # fmt: skip
        binary = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
        answers[f"OIP binary {label}"] = post(served, V2_INFER, header + x.tobytes(), binary)
        buffer = io.BytesIO()
        np.save(buffer, x)
        answers[f"v1 .npy {label}"] = post(served, V1_INFER, buffer.getvalue(), {"Content-Type": "application/x-npy"})
        token = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8],
                                        "data": [float(value)] + [0.0] * 63}]})  # fmt: skip
        answers[f"OIP JSON {label}"] = post(served, V2_INFER, token.encode(), {"Content-Type": "application/json"})

    def strict(body: bytes) -> bool:
        try:
            json.loads(body, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
        except ValueError:
            return False
        return True

    summary = assert_model_untouched(served, start)
    statuses = {name: status for name, (status, _) in answers.items()}
    succeeded = set(statuses.values()) != {400} or not all(strict(body) for _, body in answers.values())
    attack_ledger.record("local API: NaN and Infinity inputs (9 requests, 3 formats)", succeeded,
                         f"statuses {sorted(set(statuses.values()))}, every answer valid JSON; {summary}")  # fmt: skip
    assert not succeeded, answers
