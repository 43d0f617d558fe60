"""What serving a generative bundle through the agent's local API costs over the bare runtime: tokens per second and
time to first token of the runtime's own generation (the agent's session, in process) against the same generation
streamed over HTTP (Triton's generate_stream read from a socket, and the official `openai` client), interleaved
rounds, medians.

    python bench/generation_serving.py BUNDLE --trust KEY.pub [--rounds 15] [--tokens 64] [--threads 2] [--json]

Every mode generates exactly `--tokens` tokens (`ignore_eos`) greedily from the same prompt. The raw figures are the
session's (from the call to the first token; decode time over the tokens after it); the served figures are the
client's (from sending the request to the first event; the last event's arrival over the same tokens). The agent's
service runs in a process of its own, as on a device: a client in the server's process would wait for the
generating thread's GIL and add its own delay to every figure.

bench/generate.py imports `raw`, `start_server`, `triton_stream` and `openai_stream` (its served rows).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgefleet.agent.api import InferenceService, ServiceConfig  # noqa: E402
from edgefleet.agent.runtime.generative import GenerationRequest  # noqa: E402
from edgefleet.agent.runtime.model import LoadedModel  # noqa: E402
from edgefleet.core.bundle.archive import unpack_bundle  # noqa: E402
from edgefleet.core.trust.signing import TrustedKeys  # noqa: E402

PROMPT = "class Reader:\n    def read(self, path):\n        "


def raw(model: LoadedModel, tokens: int, prompt: str | Sequence[int] = PROMPT) -> tuple[float, float]:
    """The agent's session in process: (TTFT ms, TPOT ms) of one generation of `tokens` after `prompt` (text or
    token ids)."""
    generative = model.generative
    assert generative is not None
    ids = tuple(generative.encode(prompt)) if isinstance(prompt, str) else tuple(int(i) for i in prompt)
    result = generative.session.generate(GenerationRequest(ids, tokens, ignore_stop=True), lambda _p: None)
    assert result.tpot_ms is not None and len(result.tokens) == tokens
    return result.ttft_ms, result.tpot_ms


def triton_stream(port: int, name: str, tokens: int, prompt: str = PROMPT) -> tuple[float, float]:
    body = json.dumps({"text_input": prompt, "parameters": {"max_tokens": tokens, "ignore_eos": True}}).encode()
    head = b"POST /v2/models/%b/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (
        name.encode(), len(body),
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        sock.sendall(head + body)
        seen, first, last = b"", 0.0, 0.0
        while not seen.endswith(b"0\r\n\r\n"):
            data = sock.recv(65536)
            if not data:
                break
            if not first and b"data: " in seen + data:
                first = time.perf_counter()
            seen += data
            if b'"finish_reason"' in data:
                last = time.perf_counter()
    events = [json.loads(line[6:]) for line in seen.decode().split("\n") if line.startswith("data: ")]
    completion = events[-1]["usage"]["completion_tokens"]
    assert completion == tokens, events[-1]
    return (first - start) * 1000, (last - first) * 1000 / (tokens - 1)


def openai_stream(client: Any, name: str, tokens: int, prompt: str | list[int] = PROMPT) -> tuple[float, float]:
    """The `openai` client's stream of completions; `prompt` text or token ids (OpenAI's completions take both)."""
    start = time.perf_counter()
    stream = client.completions.create(model=name, prompt=prompt, max_tokens=tokens, stream=True,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    first = last = 0.0
    for chunk in stream:
        now = time.perf_counter()
        first = first or now
        if chunk.choices and chunk.choices[0].finish_reason:
            last = now
    return (first - start) * 1000, (last - first) * 1000 / (tokens - 1)


def serve(bundle_dir: Path, port_file: Path, threads: int) -> None:
    """The agent's service alone, until SIGTERM (the served side of the benchmark)."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    from edgefleet.core.bundle.manifest import Manifest

    model = LoadedModel(bundle_dir, Manifest.model_validate(manifest), threads)
    service = InferenceService([model], ServiceConfig(port=0)).start()
    port_file.write_text(str(service.port))
    stopped = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopped.__setitem__(0, True))
    while not stopped[0]:
        time.sleep(0.2)
    service.stop()
    model.close()


def start_server(bundle_dir: Path, threads: int, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = work / "port"
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(bundle_dir), "--port-file", str(port_file),
                                "--threads", str(threads)])  # fmt: skip
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.1)
    return process, int(port_file.read_text())


def main() -> None:
    if "--serve" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--serve", type=Path)
        parser.add_argument("--port-file", type=Path)
        parser.add_argument("--threads", type=int)
        served = parser.parse_args()
        serve(served.serve, served.port_file, served.threads)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--trust", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import openai

    work = Path(tempfile.mkdtemp(prefix="generation-serving-"))
    manifest = unpack_bundle(args.bundle, work / "bundle", TrustedKeys.load([args.trust]))
    (work / "bundle" / "manifest.json").write_text(manifest.model_dump_json())
    server, port = start_server(work / "bundle", args.threads, work)
    model = LoadedModel(work / "bundle", manifest, args.threads)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    name = manifest.model_name
    modes = {
        "raw": lambda: raw(model, args.tokens),
        "triton-sse": lambda: triton_stream(port, name, args.tokens),
        "openai-client": lambda: openai_stream(client, name, args.tokens),
    }
    for run in modes.values():  # warm-up
        run()
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode, run in modes.items():
            figures[mode].append(run())
    server.terminate()
    server.wait(30)
    model.close()
    rows = {}
    for mode, values in figures.items():
        ttft = statistics.median(v[0] for v in values)
        tpot = statistics.median(v[1] for v in values)
        rows[mode] = {"ttft_ms": round(ttft, 4), "tpot_ms": round(tpot, 5), "tokens_per_s": round(1000 / tpot, 1)}
    raw_row = rows["raw"]
    for row in rows.values():
        row["ttft_overhead_ms"] = round(row["ttft_ms"] - raw_row["ttft_ms"], 4)
        row["tokens_per_s_share"] = round(row["tokens_per_s"] / raw_row["tokens_per_s"], 3)
    meta = {"bundle": manifest.bundle_id, "provider": model.provider, "recipe": manifest.recipe.name,
            "tokens": args.tokens, "rounds": args.rounds, "threads": args.threads}  # fmt: skip
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return
    print(f"{meta}")
    print(f"{'mode':<15} {'TTFT ms':>9} {'+TTFT ms':>9} {'TPOT ms':>9} {'tok/s':>9} {'share':>7}")
    for mode, row in rows.items():
        print(f"{mode:<15} {row['ttft_ms']:>9.3f} {row['ttft_overhead_ms']:>9.3f} {row['tpot_ms']:>9.4f} "
              f"{row['tokens_per_s']:>9.1f} {row['tokens_per_s_share']:>7.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
