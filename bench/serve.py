"""Benchmark of the agent's runtime and inference API against raw runtime calls on the same model.

    python bench/serve.py [--bundle-dir DIR] [--threads 1] [--json]

Without --bundle-dir the demo CNN is converted for intel-x86-vnni into a temporary folder. In one run:
  1. in process: LoadedModel.run vs the raw runtime call (same model, provider, threads), interleaved
     rounds, medians (goal ≤ 1.05×);
  2. over the local HTTP API (service in its own process, the client here, keep-alive): .npy and JSON
     bodies with http.client, and .npy with a minimal socket client, minus the raw call (goal ≤ +0.3 ms);
  3. idle RSS of a process holding the agent runtime + model + API minus a bare onnxruntime process with
     the same model (goal ≤ 30 MB), with the decision cached (a restart) and after a cold selection that
     also measured OpenVINO;
  4. time from bundle directory to first answer (goal < 2 s), in a running agent and in a fresh process;
  5. whether selection (CPU EP vs OpenVINO CPU) picked the candidate that a long isolated run finds fastest.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgefleet.agent.backends import CancelToken, LoadOptions, backend_for  # noqa: E402
from edgefleet.agent.runtime import LoadedModel  # noqa: E402
from edgefleet.agent.selection import Policy  # noqa: E402
from edgefleet.core.bundle import parse_manifest  # noqa: E402
from edgefleet.core.manifest import Manifest  # noqa: E402

CPU, OV = "CPUExecutionProvider", "openvino:CPU"


def demo_bundle(work: Path) -> Path:
    from edgefleet.converter.build import ConvertRequest, convert
    from edgefleet.core.bundle import unpack_bundle
    from edgefleet.core.profiles import get_profile
    from edgefleet.core.signing import SigningKey, TrustedKeys, generate_keypair

    private, public = generate_keypair(work / "keys")
    digits = REPO / "models" / "digits"
    results = convert(
        ConvertRequest(
            model=digits / "digits_cnn.onnx", profiles=[get_profile("intel-x86-vnni")], calib=digits / "calib.npz",
            eval=digits / "eval.npz", out=work, key=SigningKey.load(private), name="digits-cnn", version="1",
        )
    )  # fmt: skip
    bundle = work / "bundle"
    manifest = unpack_bundle(Path(str(results[0].bundle)), bundle, TrustedKeys.load([public]))
    (bundle / "manifest.json").write_text(manifest.model_dump_json())
    return bundle


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Median per-call µs over rounds; each round runs every function `calls` times, in a rotating order."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up
        for _ in range(calls):
            fns[name]()
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {n: float(np.median(v)) for n, v in times.items()}


def raw_call(model_path: Path, provider: str, threads: int, precision: str) -> Callable[[dict[str, np.ndarray]], Any]:
    """The plain runtime call an application would write, without the agent."""
    if provider.startswith("openvino:"):
        import openvino as ov

        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if precision == "fp32":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        request = ov.Core().compile_model(str(model_path), provider.split(":", 1)[1], config).create_infer_request()
        return lambda feeds: request.infer(feeds, share_inputs=True)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(model_path), options, providers=[provider])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: session.run(names, feeds)


# --- child processes
SERVE = """
import sys, time; sys.path.insert(0, {repo!r})
from pathlib import Path
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.service import InferenceService, ServiceConfig
from edgefleet.core.bundle import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
svc = InferenceService([LoadedModel(d, m, {threads})], ServiceConfig(port=0)).start()
print(svc.port, flush=True); sys.stdin.read(); svc.stop()
"""

RSS_BARE = """
import sys, time, psutil, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = {threads}; o.inter_op_num_threads = 1
s = ort.InferenceSession({model!r}, o, providers=["CPUExecutionProvider"])
s.run(None, {{"input": np.zeros({shape}, np.float32)}}); time.sleep(1.0)
print(psutil.Process().memory_info().rss)
"""

RSS_AGENT = """
import sys, time, psutil, numpy as np; sys.path.insert(0, {repo!r})
from pathlib import Path
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.selection import Policy
from edgefleet.agent.service import InferenceService, ServiceConfig
from edgefleet.core.bundle import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
m = m.model_copy(update={{"providers": {providers!r}}})
model = LoadedModel(d, m, {threads}, cache_dir=Path({cache!r}))
model.check_golden(); model.run({{"input": np.zeros({shape}, np.float32)}})
svc = InferenceService([model], ServiceConfig(port=0)).start(); time.sleep(1.0)
print(psutil.Process().memory_info().rss, model.provider)
"""

FIRST_ANSWER = """
import sys; sys.path.insert(0, {repo!r})
import numpy as np
from pathlib import Path
from edgefleet.agent.runtime import LoadedModel
from edgefleet.core.bundle import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
model = LoadedModel(d, m, {threads}, cache_dir=Path({cache!r})); assert model.check_golden().passed
model.run({{"input": np.zeros({shape}, np.float32)}}); print("answered", flush=True)
"""


def python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


# --- the measurements
def bench_in_process(bundle: Path, manifest: Manifest, feeds: dict[str, np.ndarray], threads: int) -> dict[str, Any]:
    model = LoadedModel(bundle, manifest, threads)
    raw = raw_call(bundle / manifest.model_path, model.provider, threads, manifest.recipe.precision)
    medians = interleaved({"agent": lambda: model.run(feeds), "raw": lambda: raw(feeds)}, rounds=21, calls=1000)
    return {"provider": model.provider, "agent_us": medians["agent"], "raw_us": medians["raw"],
            "ratio": medians["agent"] / medians["raw"]}  # fmt: skip


def bench_api(bundle: Path, feeds: dict[str, np.ndarray], threads: int, raw_us: float) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, "-c", SERVE.format(repo=str(REPO), bundle=str(bundle), threads=threads)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        x = feeds["input"]
        buffer = io.BytesIO()
        np.save(buffer, x)
        npy = buffer.getvalue()
        body = json.dumps({"inputs": {"input": {"dtype": "float32", "shape": list(x.shape), "data": x.tolist()}}})
        conn = http.client.HTTPConnection("127.0.0.1", port)
        path = "/v1/models/digits-cnn/infer"

        def post(payload: bytes | str, kind: str) -> Callable[[], object]:
            def call() -> object:
                conn.request("POST", path, payload, {"Content-Type": kind})
                return conn.getresponse().read()

            return call

        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")
        request = (
            f"POST {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/x-npy\r\n"
            f"Content-Length: {len(npy)}\r\n\r\n"
        ).encode() + npy

        def minimal() -> object:
            sock.sendall(request)
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            return reader.read(length)

        medians = interleaved(
            {"npy, http.client": post(npy, "application/x-npy"), "json, http.client": post(body, "application/json"),
             "npy, minimal client": minimal},
            rounds=15, calls=200,
        )  # fmt: skip
        sock.close()
        conn.close()
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(10)
    return {name: {"median_us": us, "over_raw_ms": (us - raw_us) / 1000} for name, us in medians.items()}


def bench_rss(bundle: Path, manifest: Manifest, threads: int, work: Path) -> dict[str, Any]:
    shape = tuple(d if isinstance(d, int) else 1 for d in manifest.inputs[0].shape)
    model = str(bundle / manifest.model_path)
    bare = int(python(RSS_BARE.format(model=model, shape=shape, threads=threads)))
    result: dict[str, Any] = {"bare_onnxruntime_mb": bare / 2**20}
    cases = {"agent, decision cached": [CPU, OV], "agent, cold selection (CPU EP + OpenVINO measured)": [CPU, OV]}
    cache = work / "rss-cache"
    python(
        RSS_AGENT.format(
            repo=str(REPO), bundle=str(bundle), providers=[CPU, OV], threads=threads, cache=str(cache), shape=shape
        )
    )  # fmt: skip  (fills the decision cache)
    for index, (name, providers) in enumerate(cases.items()):
        folder = cache if index == 0 else work / f"rss-cold-{index}"
        rss, provider = python(
            RSS_AGENT.format(repo=str(REPO), bundle=str(bundle), providers=providers, threads=threads,
                             cache=str(folder), shape=shape)
        ).split()  # fmt: skip
        result[name] = {"rss_mb": int(rss) / 2**20, "over_bare_mb": (int(rss) - bare) / 2**20, "provider": provider}
    return result


def bench_first_answer(bundle: Path, manifest: Manifest, threads: int, work: Path) -> dict[str, float]:
    shape = tuple(d if isinstance(d, int) else 1 for d in manifest.inputs[0].shape)
    x = {manifest.inputs[0].name: np.zeros(shape, np.float32)}
    result: dict[str, float] = {}
    for name, providers in (("running agent, bundle's providers", manifest.providers),
                            ("running agent, CPU EP + OpenVINO measured", [CPU, OV])):  # fmt: skip
        candidate = manifest.model_copy(update={"providers": list(providers)})
        start = time.perf_counter()
        model = LoadedModel(bundle, candidate, threads, cache_dir=work / f"first-{len(result)}")
        model.check_golden()
        model.run(x)
        result[name] = time.perf_counter() - start
    start = time.perf_counter()
    python(FIRST_ANSWER.format(repo=str(REPO), bundle=str(bundle), threads=threads, cache=str(work / "first-cold"),
                               shape=shape))  # fmt: skip
    result["fresh process (interpreter start and imports included)"] = time.perf_counter() - start
    return result


def bench_selection(bundle: Path, manifest: Manifest, feeds: dict[str, np.ndarray], threads: int) -> dict[str, Any]:
    allowed = manifest.model_copy(update={"providers": [CPU, OV, "OpenVINOExecutionProvider"]})
    picked = LoadedModel(bundle, allowed, threads, policy=Policy())
    sessions = {}
    for provider in (CPU, OV):
        options = LoadOptions(threads=threads, precision=manifest.recipe.precision, outputs=("logits",))
        sessions[provider] = backend_for(provider).load(bundle / manifest.model_path, provider, options, CancelToken())
    isolated = interleaved({p: (lambda s=s: s.run(feeds)) for p, s in sessions.items()}, rounds=21, calls=1000)
    fastest = min(isolated, key=lambda p: isolated[p])
    return {
        "picked": picked.provider,
        "selection_medians_us": {p: v * 1000 for p, v in picked.choice.medians_ms.items()},
        "isolated_medians_us": isolated,
        "fastest": fastest,
        "picked_fastest": picked.provider == fastest,
        "not_chosen": picked.choice.reasons,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle-dir", type=Path, help="an unpacked bundle with manifest.json (default: the demo)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = args.bundle_dir or demo_bundle(work)
        manifest = parse_manifest((bundle / "manifest.json").read_text())
        from edgefleet.core.golden import GoldenSet

        feeds = GoldenSet.load(bundle / manifest.golden.path, manifest.inputs, manifest.outputs).inputs.sample(0)
        report: dict[str, Any] = {"bundle": manifest.bundle_id, "threads": args.threads}
        report["in_process"] = bench_in_process(bundle, manifest, feeds, args.threads)
        report["api"] = bench_api(bundle, feeds, args.threads, report["in_process"]["raw_us"])
        report["rss"] = bench_rss(bundle, manifest, args.threads, work)
        report["first_answer_s"] = bench_first_answer(bundle, manifest, args.threads, work)
        report["selection"] = bench_selection(bundle, manifest, feeds, args.threads)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(table(report))


def table(r: dict[str, Any]) -> str:
    inp, rss, sel = r["in_process"], r["rss"], r["selection"]
    rows = [
        ("in process: LoadedModel.run vs raw call", f"{inp['agent_us']:.2f} µs vs {inp['raw_us']:.2f} µs "
         f"({inp['provider']})", f"{inp['ratio']:.3f}×", "≤ 1.05×", inp["ratio"] <= 1.05),
    ]  # fmt: skip
    for name, row in r["api"].items():
        rows.append((f"HTTP API ({name}) vs raw call", f"{row['median_us']:.1f} µs", f"+{row['over_raw_ms']:.3f} ms",
                     "≤ +0.3 ms", row["over_raw_ms"] <= 0.3))  # fmt: skip
    for name, row in rss.items():
        if isinstance(row, dict):
            rows.append((f"idle RSS, {name}", f"{row['rss_mb']:.1f} MB (bare ORT {rss['bare_onnxruntime_mb']:.1f})",
                         f"+{row['over_bare_mb']:.1f} MB", "≤ 30 MB", row["over_bare_mb"] <= 30))  # fmt: skip
    for name, seconds in r["first_answer_s"].items():
        rows.append((f"bundle dir → first answer, {name}", "", f"{seconds:.3f} s", "< 2 s", seconds < 2))
    iso = ", ".join(f"{p} {v:.2f} µs" for p, v in sel["isolated_medians_us"].items())
    rows.append(("selection picks the fastest (isolated run: " + iso + ")", f"picked {sel['picked']}",
                 f"fastest {sel['fastest']}", "same", sel["picked_fastest"]))  # fmt: skip
    width = max(len(row[0]) for row in rows)
    lines = [f"bundle {r['bundle']}, {r['threads']} thread(s)", ""]
    lines += [f"{a:<{width}}  {b:<44} {c:>12}  goal {d:<9} {'met' if ok else 'NOT met'}" for a, b, c, d, ok in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
