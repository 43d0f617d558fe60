"""Several models in one agent process, with and without the scheduler's compute gate (issue 33's benchmark; a
skeleton built from the components: the full version serves the three through the agent's slots).

    python bench/multimodel.py [--seconds 8] [--rate 5] [--threads 2] [--lanes 1] [--json FILE]

In one process, on this machine's cores:
  - real-time: nudenet-320n (YOLOv8n at 320×320, a detector from the corpus: the nudenet wheel, cached by the tests'
    corpus helper) at a fixed rate, loaded by the agent's ONNX Runtime backend (its options: no spinning);
  - interactive: models/tinylm, converted here for generic-x86-64 (ONNX Runtime GenAI), generating continuously
    (greedy, the whole token budget, one stream after another), loaded as the agent loads it (LoadedModel);
  - batch: magika (a file-type model from the corpus) in bursts: 16 requests every 0.5 s.
Three modes, each `--seconds` long, rounds rotating the order: each model alone; naive (everything free-running, as
separate agents would be); gated (one ComputeGate: the detector real-time, tinylm interactive, magika batch). Reported:
the detector's p50 and p95 latency from its due time, tinylm's tokens/s, magika's bursts done, and the gate's queue
and compute time per slot. Goals (issue 33): detector p95 gated ≤ 1.25× alone; tinylm ≥ 70 % of its tokens/s alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, backend_for
from edgefleet.agent.runtime.generative import GenerationRequest
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.schedule import ComputeGate

CPU = "CPUExecutionProvider"
Step = Callable[[], AbstractContextManager[object]]


def tensor_model(name: str, threads: int) -> tuple[Callable[[], object], str]:
    """A corpus model on the agent's ONNX Runtime backend, and one sample of its data."""
    import onnx

    from support.models.corpus import by_name

    corpus = by_name(name)
    path = corpus.path()
    outputs = tuple(o.name for o in onnx.load(str(path), load_external_data=False).graph.output)
    session = backend_for(CPU).load(path, CPU, LoadOptions(threads=threads, outputs=outputs), CancelToken())
    feeds = {k: v[0] for k, v in corpus.data(np.random.default_rng(0), 1).items()}
    return (lambda: session.run(feeds)), f"{name} ({path.name})"


def language_model(work: Path, threads: int) -> LoadedModel:
    from edgefleet.core.trust.signing import SigningKey, generate_keypair

    from support.models.generative import convert_tinylm
    from support.runtime import unpack

    private, public = generate_keypair(work / "keys")
    (result,) = convert_tinylm(work / "out", SigningKey.load(private), ("generic-x86-64",))
    if not result.bundle:
        raise SystemExit(f"tinylm did not convert: {result.error}")
    return LoadedModel(*unpack(Path(str(result.bundle)), public, work / "tinylm"), threads)


class Mode:
    """One run of the mix: which models run, and through which gate."""

    def __init__(self, detector: bool, lm: bool, burst: bool, gate: ComputeGate | None) -> None:
        self.detector, self.lm, self.burst, self.gate = detector, lm, burst, gate

    def step(self, slot: str) -> Step:
        gate = self.gate
        return (lambda: gate.step(slot)) if gate is not None else nullcontext


def run_mode(mode: Mode, parts: dict[str, Any], seconds: float, rate: float) -> dict[str, Any]:
    stop = threading.Event()
    out: dict[str, Any] = {}
    threads = []
    if mode.lm:
        lm: LoadedModel = parts["lm"]
        assert lm.generative is not None
        prompt = tuple(lm.generative.encode("Once upon a time"))
        tokens = [0]

        def generate() -> None:
            assert lm.generative is not None
            step = mode.step("tinylm") if mode.gate is not None else None
            while not stop.is_set():
                request = GenerationRequest(prompt, 64, ignore_stop=True, step=step)
                tokens[0] += len(lm.generative.generate(request, lambda _: None).tokens)

        threads.append(threading.Thread(target=generate))
    if mode.burst:
        embed, bursts = parts["burst"], [0]

        def bursty() -> None:
            step = mode.step("magika")
            while not stop.wait(0.5):
                for _ in range(16):
                    with step():
                        embed()
                bursts[0] += 1

        threads.append(threading.Thread(target=bursty))
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    latencies: list[float] = []
    if mode.detector:
        detect, step = parts["detector"], mode.step("detector")
        index = 0
        while time.perf_counter() - start < seconds:
            due = start + index * (1 / rate)
            time.sleep(max(0.0, due - time.perf_counter()))
            with step():
                detect()
            latencies.append((time.perf_counter() - due) * 1000)
            index += 1
    else:
        time.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - start
    for thread in threads:
        thread.join(120)
    if latencies:
        out["detector_p50_ms"], out["detector_p95_ms"] = (float(v) for v in np.percentile(latencies, [50, 95]))
    if mode.lm:
        out["tokens_per_s"] = tokens[0] / elapsed
    if mode.burst:
        out["bursts"] = bursts[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="each mode's time in a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=5.0, help="detector requests a second")
    parser.add_argument(
        "--threads", type=int, default=2, help="intra-op threads of each model (as if it had the device)"
    )
    parser.add_argument("--lanes", type=int, default=1, help="the gate's lanes for interactive and batch work")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        detector, detector_name = tensor_model("nudenet-320n", args.threads)
        burst, burst_name = tensor_model("magika", args.threads)
        lm = language_model(Path(tmp), args.threads)
        parts = {"detector": detector, "burst": burst, "lm": lm}
        for _ in range(3):
            detector(), burst()
        gate = ComputeGate(lanes=args.lanes)
        gate.assign("detector", "real-time")
        gate.assign("tinylm", "interactive")
        gate.assign("magika", "batch")
        modes = {
            "detector alone": Mode(True, False, False, None),
            "tinylm alone": Mode(False, True, False, None),
            "naive (all free-running)": Mode(True, True, True, None),
            "gated": Mode(True, True, True, gate),
        }
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
        for index in range(args.rounds):
            names = list(modes)
            for name in names[index % len(names) :] + names[: index % len(names)]:
                rounds[name].append(run_mode(modes[name], parts, args.seconds, args.rate))
        lm.close()
    medians = {
        name: {key: float(np.median([r[key] for r in results])) for key in results[0]}
        for name, results in rounds.items()
    }
    alone_p95 = medians["detector alone"]["detector_p95_ms"]
    alone_tps = medians["tinylm alone"]["tokens_per_s"]
    gated = medians["gated"]
    report = {
        "models": {"real-time": detector_name, "interactive": "tinylm (ONNX Runtime GenAI)", "batch": burst_name},
        "rate_per_s": args.rate, "threads_per_model": args.threads, "lanes": args.lanes, "rounds": args.rounds,
        "seconds_per_mode": args.seconds,
        "modes": medians,
        "slots": {slot: w.fields() for slot, w in gate.timing().items()},
        "goals": {
            "detector_p95_gated_over_alone": gated["detector_p95_ms"] / alone_p95,
            "detector_p95_naive_over_alone": medians["naive (all free-running)"]["detector_p95_ms"] / alone_p95,
            "tinylm_tokens_gated_share": gated["tokens_per_s"] / alone_tps,
            "met": gated["detector_p95_ms"] <= 1.25 * alone_p95 and gated["tokens_per_s"] >= 0.7 * alone_tps,
        },
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


def table(r: dict[str, Any]) -> str:
    lines = [f"real-time {r['models']['real-time']} at {r['rate_per_s']:g}/s; interactive {r['models']['interactive']};"
             f" batch {r['models']['batch']} in bursts; {r['threads_per_model']} threads a model, {r['rounds']} "
             f"rounds of {r['seconds_per_mode']:g} s, medians", ""]  # fmt: skip
    for name, row in r["modes"].items():
        figures = []
        if "detector_p95_ms" in row:
            figures.append(f"detector p50 {row['detector_p50_ms']:.1f} ms p95 {row['detector_p95_ms']:.1f} ms")
        if "tokens_per_s" in row:
            figures.append(f"tinylm {row['tokens_per_s']:.0f} tokens/s")
        if "bursts" in row:
            figures.append(f"{row['bursts']:.0f} bursts")
        lines.append(f"{name:<26} " + ", ".join(figures))
    lines.append("")
    for slot, timing in r["slots"].items():
        queue, compute = timing["queue_ms"] or {}, timing["compute_ms"] or {}
        lines.append(f"gate, {slot:<9} queue p50 {queue.get('p50_ms') or 0:.2f} ms p95 {queue.get('p95_ms') or 0:.2f} "
                     f"ms; compute p50 {compute.get('p50_ms') or 0:.2f} ms; steps {timing['batches']}, "
                     f"yields {timing['yields']}")  # fmt: skip
    goals = r["goals"]
    lines += [
        "",
        f"detector p95: gated {goals['detector_p95_gated_over_alone']:.2f}× alone (goal ≤ 1.25×), naive "
        f"{goals['detector_p95_naive_over_alone']:.2f}×",
        f"tinylm tokens/s gated: {goals['tinylm_tokens_gated_share']:.0%} of alone (goal ≥ 70 %)",
        f"goals {'met' if goals['met'] else 'NOT met'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
