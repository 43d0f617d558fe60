"""Dynamic batching: 4 concurrent clients of a sub-millisecond model, the agent's batcher against raw single-request
ONNX Runtime on the same cores (issue 33, item 6; goal ≥ 1.0× raw throughput).

    python bench/batching.py [--clients 4] [--threads 2] [--rounds 7] [--seconds 1.5] [--json FILE]

The model is the demo digits CNN (models/digits), converted for intel-x86-vnni to ONNX Runtime like any model, then
given a symbolic batch dimension `N` (the source CNN computes any batch; the converted graph fixes its batch at 1,
so as shipped it is served unbatched, and the agent says why). In one process, each mode `clients` threads looping
for a fixed time, rounds rotating the order, medians of requests per second:
  - raw: each thread calls the same ONNX Runtime session, one request per run, as an application writes it (ORT's
    default options), at 1 intra-op thread and at `threads`; the better of the two is the reference;
  - agent (the model loaded as the agent loads it, at `threads` intra-op threads, no spinning), unbatched: each
    thread goes through the local API's run path (InferenceService.admit(...).run: checks,
    accounting, the model's run), without the HTTP transport;
  - agent, batched: the same path with dynamic batching on, one batch at a time: max_queue_delay_ms 0 (a batch is
    what queued while the previous one ran, up to 8), then 0.2 ms and up to `clients` rows (wait briefly for all);
  - the batcher alone: the model's checks and the batcher (0.2 ms, up to `clients`), without the API's admission
    and accounting: what batching itself costs and gains.
Every batched answer is compared with the unbatched one, bit for bit, on the evaluation digits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving.setup import CPU, REPO, demo_bundle, raw_call

sys.path.insert(0, str(REPO))

from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.service import InferenceService
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.schedule import Batcher, BatchingConfig, batch_support
from edgefleet.core.bundle.archive import parse_manifest
from edgefleet.core.bundle.manifest import Manifest, TensorSpec

Feeds = dict[str, np.ndarray]


def any_batch(bundle: Path, dest: Path) -> tuple[Path, Manifest]:
    """The converted bundle with the source CNN, its batch dimension named `N` (inputs, outputs, golden as before)."""
    import shutil

    import onnx

    manifest = parse_manifest((bundle / "manifest.json").read_text())
    shutil.copytree(bundle, dest)
    model = onnx.load(str(REPO / "models" / "digits" / "digits_cnn.onnx"))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(dest / manifest.model_path))
    dynamic = manifest.model_copy(update={
        "model_name": "digits-any-batch", "recipe": manifest.recipe.model_copy(update={"precision": "fp32"}),
        "inputs": [TensorSpec(name="input", dtype="float32", shape=["N", 1, 8, 8])],
        "outputs": [TensorSpec(name="logits", dtype="float32", shape=["N", 10])],
    })  # fmt: skip
    (dest / "manifest.json").write_text(dynamic.model_dump_json())
    return dest, dynamic


def rate(calls: list[Callable[[], object]], seconds: float) -> float:
    """Requests per second of all client threads together, each looping for `seconds`."""
    stop = threading.Event()
    counts = [0] * len(calls)

    def loop(index: int) -> None:
        call = calls[index]
        while not stop.is_set():
            call()
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def through(service: InferenceService, name: str, feeds: Feeds) -> Callable[[], object]:
    def call() -> object:
        ticket = service.admit(name)
        try:
            return ticket.run(feeds)
        finally:
            ticket.release()

    return call


def identical(service: InferenceService, model: LoadedModel, samples: np.ndarray, clients: int) -> dict[str, Any]:
    """Each evaluation digit answered through the batched path by `clients` threads at once, against its answer
    alone: how many are bit-for-bit identical, and the largest difference."""
    answers: list[np.ndarray | None] = [None] * len(samples)

    def ask(start: int) -> None:
        for index in range(start, len(samples), clients):
            ticket = service.admit(model.manifest.model_name)
            try:
                answers[index] = ticket.run({"input": samples[index]})[0]["logits"]
            finally:
                ticket.release()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    same, worst = 0, 0.0
    for sample, answer in zip(samples, answers, strict=True):
        alone = model.run({"input": sample})["logits"]
        assert answer is not None
        same += int(np.array_equal(alone, answer))
        worst = max(worst, float(np.abs(alone - answer).max()))
    return {"samples": len(samples), "identical": same, "max_abs_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="the agent's intra-op threads (raw: 1 and this)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.5, help="each mode's time in a round")
    parser.add_argument("--json", type=Path, help="write the result here (bench/results/batching.json)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shipped = demo_bundle(work, runtimes=("onnxruntime",))
        shipped_manifest = parse_manifest((shipped / "manifest.json").read_text())
        bundle, manifest = any_batch(shipped, work / "any-batch")
        model = LoadedModel(bundle, manifest, args.threads)  # the agent's backend: no spinning between runs
        raws = {threads: raw_call(bundle / manifest.model_path, CPU, threads, "fp32") for threads in (1, args.threads)}
        raw = raws[1]
        samples = np.load(REPO / "models" / "digits" / "eval.npz")["input"].astype(np.float32)
        feeds = {"input": samples[0]}
        start = time.perf_counter()
        for _ in range(500):
            raw(feeds)
        single_us = (time.perf_counter() - start) / 500 * 1e6
        name, clients = manifest.model_name, args.clients
        plain = InferenceService([model], ServiceConfig(port=0, concurrency=clients))
        settings = {  # (max_queue_delay_ms, preferred_batch_size): what queued meanwhile; wait up to 0.2 ms for all
            "delay 0, up to 8": (0.0, 8),
            f"delay 0.2 ms, up to {clients}": (0.2, clients),
        }
        batched = {
            label: InferenceService([model], ServiceConfig(port=0, concurrency=clients, batching=BatchingConfig(
                max_queue_delay_ms=delay, preferred_batch_size=size)))
            for label, (delay, size) in settings.items()
        }  # fmt: skip
        bare = Batcher(model.run_checked, BatchingConfig(max_queue_delay_ms=0.2, preferred_batch_size=clients))

        def batcher_alone() -> object:
            model.check(feeds)
            return bare.run(feeds)

        modes: dict[str, list[Callable[[], object]]] = {
            **{f"raw ONNX Runtime, one request a run, {threads} intra-op thread(s)": [lambda r=r: r(feeds)] * clients
               for threads, r in raws.items()},
            "agent, unbatched": [through(plain, name, feeds)] * clients,
            **{f"agent, batched ({label})": [through(service, name, feeds)] * clients
               for label, service in batched.items()},
            f"the batcher alone (delay 0.2 ms, up to {clients}; no API accounting)": [batcher_alone] * clients,
        }  # fmt: skip
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        for calls in modes.values():  # warm-up
            rate(calls, 0.3)
        for index in range(args.rounds):
            names = list(modes)
            for mode in names[index % len(names) :] + names[: index % len(names)]:
                rates[mode].append(rate(modes[mode], args.seconds))
        sizes = {}
        for label, service in batched.items():
            total = service._batchers[id(model)].timer.total()
            sizes[label] = total.batched_requests / max(1, total.batches)
        check = identical(next(iter(batched.values())), model, samples, clients)
        for service in (plain, *batched.values()):
            service.stop()
    medians = {mode: float(np.median(values)) for mode, values in rates.items()}
    raw_rps = max(rps for mode, rps in medians.items() if mode.startswith("raw"))  # the better raw configuration
    report = {
        "model": f"digits CNN (batch N), fp32, {model.provider}, the agent at {args.threads} intra-op thread(s)",
        "single_call_us": single_us,
        "clients": clients,
        "rounds": args.rounds,
        "seconds_per_mode": args.seconds,
        "shipped_bundle_batching": batch_support(shipped_manifest).reason,
        "modes": {
            mode: {"rps": rps, "over_raw": rps / raw_rps, "rounds_rps": rates[mode]} for mode, rps in medians.items()
        },
        "mean_batch": sizes,
        "answers": check,
        "goal": {
            "batched_over_raw": max(rps for mode, rps in medians.items() if mode.startswith("agent, batched"))
            / raw_rps,
            "at_least": 1.0,
        },
    }
    report["goal"]["met"] = report["goal"]["batched_over_raw"] >= 1.0
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


def table(r: dict[str, Any]) -> str:
    lines = [f"{r['model']}: {r['single_call_us']:.1f} µs a single call; {r['clients']} clients, {r['rounds']} rounds "
             f"of {r['seconds_per_mode']:g} s per mode, medians", ""]  # fmt: skip
    width = max(len(m) for m in r["modes"])
    for mode, row in r["modes"].items():
        lines.append(f"{mode:<{width}}  {row['rps']:>9.0f} req/s  {row['over_raw']:.2f}× the better raw")
    sizes = ", ".join(f"{k}: {v:.2f}" for k, v in r["mean_batch"].items())
    answers = r["answers"]
    goal = r["goal"]
    lines += [
        "",
        f"mean batch ({sizes})",
        f"answers identical to unbatched: {answers['identical']}/{answers['samples']} "
        f"(max abs difference {answers['max_abs_difference']:g})",
        f"the shipped bundle (batch fixed): {r['shipped_bundle_batching']}",
        f"goal: batched ≥ 1.0× raw: {goal['batched_over_raw']:.2f}× — {'met' if goal['met'] else 'NOT met'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
