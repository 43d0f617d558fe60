"""Throughput of the inference API at 4 concurrent clients against 4 threads calling the runtime directly.

The model is a generated MLP (onnx.helper), converted and served like any model: the converter's choice decides its
time a call (int8-static on OpenVINO took 3.3 ms on 2026-12-02; int8-dynamic on CPU EP 0.26 ms on 2026-12-05, and
at that size the API's own CPU per request, not the model, sets the ratio: docs/local-api.md). Rounds alternate raw
and API, a fixed time each; medians of requests per second.
"""

from __future__ import annotations

import http.client
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

WIDTH, LAYERS = 1024, 12


def mlp(path: Path, width: int = WIDTH) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "x"
    for index in range(LAYERS):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(weight, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [f"m{index}"]))
        last = index == LAYERS - 1
        nodes.append(helper.make_node("Relu", [f"m{index}"], ["y" if last else f"r{index}"]))
        previous = f"r{index}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _rate(workers: list[Callable[[], object]], seconds: float) -> float:
    """Calls per second of all workers together, each looping in its own thread for `seconds`."""
    stop = threading.Event()
    counts = [0] * len(workers)

    def loop(index: int) -> None:
        call = workers[index]
        while not stop.is_set():
            call()
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(workers))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def bench_throughput(
    work: Path,
    threads: int,
    clients: int = 4,
    rounds: int = 5,
    seconds: float = 2.0,
    baseline: Path | None = None,
    width: int = WIDTH,
) -> dict[str, Any]:
    """With `baseline`, the API served from that checkout too (OIP binary, minimal client), in the same rounds;
    `width`: the MLP's (a wider one takes longer a call)."""
    from edgefleet.core.bundle.archive import parse_manifest
    from serving.clients import MinimalClient, oip_binary
    from serving.setup import make_bundle, raw_call, serve

    folder = Path(tempfile.mkdtemp(dir=work))
    model = mlp(folder / "mlp.onnx", width)
    rng = np.random.default_rng(1)
    for name in ("calib", "eval"):
        np.savez(folder / f"{name}.npz", x=rng.standard_normal((16, 1, width)).astype(np.float32))
    bundle = make_bundle(folder, model, folder / "calib.npz", folder / "eval.npz", "mlp")
    manifest = parse_manifest((bundle / "manifest.json").read_text())
    feeds = {"x": rng.standard_normal((1, width)).astype(np.float32)}
    child, port = serve(bundle, threads, concurrency=clients)
    served = http.client.HTTPConnection("127.0.0.1", port)
    served.request("GET", "/v1/models/mlp")
    provider = json.loads(served.getresponse().read())["provider"]  # the raw call uses what the agent chose
    served.close()
    raw = raw_call(bundle / manifest.model_path, provider, threads, manifest.recipe.precision)
    start = time.perf_counter()
    for _ in range(50):
        raw(feeds)
    single_ms = (time.perf_counter() - start) / 50 * 1000
    path, body, headers = oip_binary("mlp", feeds)
    lean = [MinimalClient(port) for _ in range(clients)]
    conns = [http.client.HTTPConnection("127.0.0.1", port) for _ in range(clients)]
    other = serve(bundle, threads, concurrency=clients, repo=baseline.resolve()) if baseline is not None else None
    lean_other = [MinimalClient(other[1]) for _ in range(clients)] if other is not None else []

    def via_http_client(conn: http.client.HTTPConnection) -> Callable[[], object]:
        def call() -> object:
            conn.request("POST", path, body, headers)
            return conn.getresponse().read()

        return call

    modes: dict[str, list[Callable[[], object]]] = {
        "raw runtime": [lambda: raw(feeds)] * clients,
        "OIP binary, minimal client": [lambda c=c: c.post(path, body, headers) for c in lean],
        "OIP binary, http.client": [via_http_client(c) for c in conns],
    }
    if lean_other:
        modes["OIP binary, minimal client [baseline]"] = [lambda c=c: c.post(path, body, headers) for c in lean_other]
    rates: dict[str, list[float]] = {name: [] for name in modes}
    try:
        for workers in modes.values():  # warm-up
            _rate(workers, 0.5)
        for index in range(rounds):
            names = list(modes)
            for name in names[index % len(names) :] + names[: index % len(names)]:
                rates[name].append(_rate(modes[name], seconds))
    finally:
        for client in [*lean, *lean_other]:
            client.close()
        for conn in conns:
            conn.close()
        for process in [child] + ([other[0]] if other is not None else []):
            if process.stdin:
                process.stdin.close()
            process.wait(10)
    medians = {name: float(np.median(values)) for name, values in rates.items()}
    raw_rps = medians.pop("raw runtime")
    return {
        "model": f"MLP {LAYERS}×{width}, {manifest.recipe.precision}, {provider}",
        "single_call_ms": single_ms,
        "clients": clients,
        "raw_rps": raw_rps,
        "api": {name: {"rps": rps, "share_of_raw": rps / raw_rps} for name, rps in medians.items()},
    }
