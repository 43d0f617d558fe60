"""Benchmark of the agent's runtime and inference API against raw runtime calls on the same model.

    python bench/serve.py [--bundle-dir DIR] [--threads 1] [--json] [--baseline-repo /work/main]
                          [--parts quality,api,throughput,rss,first-answer,selection]

Without --bundle-dir the demo CNN is converted for intel-x86-vnni into a temporary folder. In one run:
  1. in process: LoadedModel.run vs the raw runtime call (same model, provider, threads), interleaved
     rounds, medians (goal ≤ 1.05×);
  2. over the local HTTP API (service in its own process, the client here, keep-alive): the Open Inference
     Protocol's binary tensor format and /v1's .npy and JSON bodies with http.client, and OIP binary and .npy
     with a minimal socket client, minus the raw call (goal ≤ +0.3 ms);
  2b. throughput at 4 concurrent clients (OIP binary, keep-alive) against 4 threads calling the runtime
     directly, for a generated MLP (bench/serving/throughput.py; goal ≥ 90 % of raw);
  3. idle RSS of a process holding the agent runtime + model + API minus a bare onnxruntime process with
     the same model (goal ≤ 25 MB, issue #25; it was 30 MB), with the decision cached (a restart), after one
     /metrics scrape, and after a cold selection that also measured OpenVINO; with --baseline-repo, the same
     process from another checkout;
  4. time from bundle directory to first answer with no cached decision (goal < 2 s) and, in a fresh process,
     with the decision cached (an agent's restart; goal < 1 s), each try in a fresh process: in a running agent
     (imports done), in a fresh process (interpreter start included), and with the measuring worker started when
     the offer was accepted; with --baseline-repo, the other checkout in the same rounds, interleaved, medians;
  5. whether selection (CPU EP vs OpenVINO CPU) picked the candidate that a long isolated run finds fastest;
  6. model quality (bench/serving/quality.py): drift statistics' cost on the request path and memory, and a shadow
     model's effect on the served p50 at 10 % and 100 % mirroring (`--quality-only` runs just this part).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from serving.setup import CPU, OV, REPO, demo_bundle, interleaved, raw_call, serve

sys.path.insert(0, str(REPO))

from serving.footprint import bench_first_answer, bench_rss
from serving.quality import bench_quality, quality_rows

from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, backend_for
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.runtime.selection.selector import Policy
from edgefleet.core.bundle.archive import parse_manifest
from edgefleet.core.bundle.manifest import Manifest

NPY_HEADERS = {"Content-Type": "application/x-npy"}


# --- the measurements
def bench_in_process(bundle: Path, manifest: Manifest, feeds: dict[str, np.ndarray], threads: int) -> dict[str, Any]:
    model = LoadedModel(bundle, manifest, threads)
    raw = raw_call(bundle / manifest.model_path, model.provider, threads, manifest.recipe.precision)
    medians = interleaved({"agent": lambda: model.run(feeds), "raw": lambda: raw(feeds)}, rounds=21, calls=1000)
    return {"provider": model.provider, "agent_us": medians["agent"], "raw_us": medians["raw"],
            "ratio": medians["agent"] / medians["raw"]}  # fmt: skip


def bench_api(
    bundle: Path, manifest: Manifest, feeds: dict[str, np.ndarray], threads: int, baseline: Path | None
) -> dict[str, Any]:
    """Median µs a request per client and body format, interleaved with the raw runtime call they wrap."""
    from serving.clients import MinimalClient, oip_binary

    raw = raw_call(bundle / manifest.model_path, CPU, threads, manifest.recipe.precision)
    x = feeds["input"]
    buffer = io.BytesIO()
    np.save(buffer, x)
    npy, v1 = buffer.getvalue(), "/v1/models/digits-cnn/infer"
    as_json = json.dumps({"inputs": {"input": {"dtype": "float32", "shape": list(x.shape), "data": x.tolist()}}})
    oip_path, oip_body, oip_headers = oip_binary("digits-cnn", feeds)
    servers = {"": serve(bundle, threads)}
    if baseline is not None:
        servers[" [baseline]"] = serve(bundle, threads, repo=baseline.resolve())
    closers: list[Callable[[], object]] = []
    calls: dict[str, Callable[[], object]] = {"raw call": lambda: raw(feeds)}
    try:
        for tag, (_, port) in servers.items():
            conn = http.client.HTTPConnection("127.0.0.1", port)
            lean = MinimalClient(port)
            closers += [conn.close, lean.close]

            def post(path: str, body: bytes | str, headers: dict[str, str], c=conn) -> Callable[[], object]:  # type: ignore[no-untyped-def]
                def call() -> object:
                    c.request("POST", path, body, headers)
                    return c.getresponse().read()

                return call

            if not tag:
                calls["OIP binary, http.client"] = post(oip_path, oip_body, oip_headers)
                calls["v1 json, http.client"] = post(v1, as_json, {"Content-Type": "application/json"})
            if not tag or (baseline is not None and any(
                (baseline / "agent" / rel).exists() for rel in ("routes_v2.py", "api/oip_routes.py")
            )):  # fmt: skip
                calls[f"OIP binary, minimal client{tag}"] = lambda le=lean: le.post(oip_path, oip_body, oip_headers)
            calls[f"v1 npy, http.client{tag}"] = post(v1, npy, NPY_HEADERS)
            calls[f"v1 npy, minimal client{tag}"] = lambda le=lean: le.post(v1, npy, NPY_HEADERS)
        medians = interleaved(calls, rounds=15, calls=200)
    finally:
        for close in closers:
            close()
        for child, _ in servers.values():
            if child.stdin:
                child.stdin.close()
            child.wait(10)
    raw_us = medians.pop("raw call")
    return {n: {"median_us": us, "raw_us": raw_us, "over_raw_ms": (us - raw_us) / 1000} for n, us in medians.items()}


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
    parser.add_argument("--parts", default="quality,api,throughput,rss,first-answer,selection",
                        help="what to measure besides the in-process comparison (comma-separated)")  # fmt: skip
    parser.add_argument("--baseline-repo", type=Path,
                        help="another checkout (e.g. before a change), measured beside ours")  # fmt: skip
    parser.add_argument("--quality-only", action="store_true", help="only the model-quality section (6)")
    parser.add_argument("--mlp-width", type=int, default=1024,
                        help="the throughput MLP's width (2048: about 3 ms a call as OpenVINO int8)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = args.bundle_dir or demo_bundle(work)
        manifest = parse_manifest((bundle / "manifest.json").read_text())
        from edgefleet.core.quality.golden import GoldenSet

        feeds = GoldenSet.load(bundle / manifest.golden.path, manifest.inputs, manifest.outputs).inputs.sample(0)
        report: dict[str, Any] = {"bundle": manifest.bundle_id, "threads": args.threads}
        parts = set(args.parts.split(","))
        if "quality" in parts or args.quality_only:
            report["quality"] = bench_quality(bundle, manifest, args.threads)
        if args.quality_only:
            print(json.dumps(report, indent=2) if args.json else table(report))
            return
        report["in_process"] = bench_in_process(bundle, manifest, feeds, args.threads)
        if "api" in parts:  # the raw call is ONNX Runtime's: an IR bundle is compared as the demo CNN in ONNX
            onnx_bundle = bundle if manifest.format == "onnx" else demo_bundle(work, runtimes=("onnxruntime",))
            onnx_manifest = parse_manifest((onnx_bundle / "manifest.json").read_text())
            report["api"] = bench_api(onnx_bundle, onnx_manifest, feeds, args.threads, args.baseline_repo)
        if "throughput" in parts:
            from serving.throughput import bench_throughput

            report["throughput"] = bench_throughput(work, args.threads, baseline=args.baseline_repo,
                                                    width=args.mlp_width)  # fmt: skip
        if "rss" in parts:
            report["rss"] = bench_rss(bundle, manifest, args.threads, work, args.baseline_repo)
        if "first-answer" in parts:
            bundles = {"demo bundle": bundle}
            if manifest.format != "onnx":  # the measuring worker is needed where CPU EP and OpenVINO both run it
                bundles["demo CNN as ONNX"] = demo_bundle(work, runtimes=("onnxruntime",))
            report["first_answer_s"] = bench_first_answer(bundles, args.threads, work, args.baseline_repo)
        if "selection" in parts:
            report["selection"] = bench_selection(bundle, manifest, feeds, args.threads)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(table(report))


def table(r: dict[str, Any]) -> str:
    rows = quality_rows(r["quality"]) if "quality" in r else []
    if "in_process" in r:
        rows += main_rows(r)
    width = max(len(row[0]) for row in rows)
    lines = [f"bundle {r['bundle']}, {r['threads']} thread(s)", ""]
    lines += [f"{a:<{width}}  {b:<44} {c:>12}  goal {d:<9} {'met' if ok else 'NOT met'}" for a, b, c, d, ok in rows]
    return "\n".join(lines)


def main_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, bool]]:
    inp = r["in_process"]
    rows = [
        ("in process: LoadedModel.run vs raw call", f"{inp['agent_us']:.2f} µs vs {inp['raw_us']:.2f} µs "
         f"({inp['provider']})", f"{inp['ratio']:.3f}×", "≤ 1.05×", inp["ratio"] <= 1.05),
    ]  # fmt: skip
    for name, row in r.get("api", {}).items():
        rows.append((f"HTTP API ({name}) vs raw call", f"{row['median_us']:.1f} µs (raw {row['raw_us']:.1f})",
                     f"+{row['over_raw_ms']:.3f} ms",
                     "≤ +0.3 ms", row["over_raw_ms"] <= 0.3))  # fmt: skip
    tp = r.get("throughput", {"api": {}})
    for name, row in tp["api"].items():
        rows.append((f"throughput, {tp['clients']} clients ({name}), {tp['model']} ({tp['single_call_ms']:.2f} ms)",
                     f"{row['rps']:.0f} vs raw {tp['raw_rps']:.0f} req/s", f"{row['share_of_raw']:.0%}", "≥ 90 %",
                     row["share_of_raw"] >= 0.9))  # fmt: skip
    rss = r.get("rss", {})
    for name, row in rss.items():
        if isinstance(row, dict):
            rows.append((f"idle RSS, {name}", f"{row['rss_mb']:.1f} MB (bare ORT {rss['bare_onnxruntime_mb']:.1f})",
                         f"+{row['over_bare_mb']:.1f} MB", "≤ 25 MB", row["over_bare_mb"] <= 25))  # fmt: skip
    first = r.get("first_answer_s", {})
    for name, seconds in first.items():
        if name.endswith(" [baseline]"):
            continue
        if name.startswith("measuring worker start"):
            rows.append((name, "", f"{seconds:.3f} s", "", True))
            continue
        base = first.get(f"{name} [baseline]")
        detail = f"baseline {base:.3f} s: {seconds / base:.2f}×" if base else ""
        limit = 1.0 if "decision cached" in name else 2.0
        rows.append((f"bundle dir → first answer, {name}", detail, f"{seconds:.3f} s", f"< {limit:g} s",
                     seconds < limit))  # fmt: skip
    if sel := r.get("selection"):
        iso = ", ".join(f"{p} {v:.2f} µs" for p, v in sel["isolated_medians_us"].items())
        rows.append(("selection picks the fastest (isolated run: " + iso + ")", f"picked {sel['picked']}",
                     f"fastest {sel['fastest']}", "same", sel["picked_fastest"]))  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
