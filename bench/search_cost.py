"""Benchmark: what the converter's search costs on a real ≈10 MB model, and where the time goes.

Runs `convert` (the code behind `edgefleet convert`) on one model at the profile's threads, cold (empty build
cache) then warm (the same cache), and prints the wall time per phase: prepare (graph passes, each gated),
export (ONNX → OpenVINO, saving artifacts), quantize (INT8 passes, calibration excluded), calibration (the
quantizers' statistics collection: onnxruntime's calibrators and NNCF's statistics aggregator, clocked by
wrapping those two library entry points in this bench only), accuracy (running and scoring each candidate on
the evaluation set), layer-report (the per-layer loss ranking), timing (interleaved latency rounds), other
(loading data and the model, the FP32 reference outputs, writing and signing the bundle). Also the CPU seconds
and the load average, because this machine is shared.

    python bench/search_cost.py [--model ppocr-rec] [--samples 24] [--threads 2] [--json PATH]

Goal (issue 12): the search on a 10 MB model finishes in ≤ 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # test helpers: corpus, silero
from edgefleet.converter import ConvertRequest, convert, phases
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey, generate_keypair

REPO = Path(__file__).resolve().parent.parent
ROWS = ("prepare", "export", "quantize", "calibration", "accuracy", "layer-report", "timing")


@contextlib.contextmanager
def calibration_clock() -> Iterator[None]:
    """Charge the quantizers' statistics collection to the 'calibration' phase (bench instrumentation)."""
    from nncf.common.tensor_statistics.aggregator import StatisticsAggregator
    from onnxruntime.quantization import calibrate

    targets: list[tuple[Any, str]] = [
        (calibrate.MinMaxCalibrater, "collect_data"),
        (calibrate.HistogramCalibrater, "collect_data"),
        (StatisticsAggregator, "collect_statistics"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in targets]

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with phases.phase("calibration"):
                return method(*args, **kwargs)

        return timed

    for owner, name, method in saved:
        setattr(owner, name, wrap(method))
    try:
        yield
    finally:
        for owner, name, method in saved:
            setattr(owner, name, method)


def _case(name: str, work: Path, samples: int) -> tuple[Path, Path, Path, dict[str, str], str | None, float | None]:
    if name == "silero-vad":
        from support.fleet import silero_model

        return (silero_model(), REPO / "models/testbed/silero_calib.npz", REPO / "models/testbed/silero_eval.npz",
                {"sr": "16000"}, None, None)  # fmt: skip
    from support.models import corpus

    model = corpus.by_name(name)
    calib, evaluation = corpus.dataset(model, work / "data", count=samples)
    return model.path(), calib, evaluation, model.pins, model.metric, model.min_score


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_once(request: ConvertRequest, label: str) -> dict[str, object]:
    load_before = os.getloadavg()[0]
    cpu0, start = _cpu_s(), time.perf_counter()
    with phases.recording() as clock, calibration_clock():
        (result,) = convert(request, progress=lambda msg: print(f"   {msg}", file=sys.stderr, flush=True))
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu0
    seconds = {name: round(clock.seconds.get(name, 0.0), 2) for name in ROWS}
    seconds["other"] = round(wall - sum(seconds.values()), 2)
    pruned = [c["name"] for c in result.candidates if str(c.get("rejected") or "").startswith("pruned")]
    built = [c for c in result.candidates if not str(c.get("rejected") or "").startswith(("not suited",))]
    return {
        "run": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2), "phases_s": seconds, "counts": dict(clock.counts),
        "recipe": result.recipe, "score": result.accuracy, "latency_ms": result.latency_ms,
        "candidates": len(built), "pruned": pruned, "error": result.error,
    }  # fmt: skip


def _print(model: str, rows: list[dict[str, object]]) -> None:
    print(f"search cost: {model}")
    print(f"{'phase':14}" + "".join(f"{r['run']!s:>12}" for r in rows))
    for name in (*ROWS, "other"):
        print(f"{name:14}" + "".join(f"{r['phases_s'][name]:11.1f}s" for r in rows))  # type: ignore[index]
    for key, unit in (("wall_s", "s"), ("cpu_s", "s"), ("load_before", ""), ("load_after", "")):
        print(f"{key:14}" + "".join(f"{float(r[key]):11.1f}{unit or ' '}" for r in rows))  # type: ignore[arg-type]
    for r in rows:
        print(f"{r['run']}: chose {r['recipe']} (score {r['score']}, {r['latency_ms']} ms) from {r['candidates']} "
              f"candidates; pruned {r['pruned'] or 'none'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="ppocr-rec", help="a tests/support/models/corpus.py model, or silero-vad")
    parser.add_argument("--profile", default="intel-x86-vnni")
    parser.add_argument("--samples", type=int, default=24, help="calibration and evaluation samples")
    parser.add_argument("--threads", type=int, default=2, help="evaluation threads (the profile sets timing's)")
    parser.add_argument("--time-budget", type=float, default=None, help="the search's --time-budget (s)")
    parser.add_argument("--no-warm", action="store_true", help="only the cold run")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "search_cost.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, calib, evaluation, pins, metric, min_score = _case(args.model, work, args.samples)
        key = SigningKey.load(generate_keypair(work / "keys")[0])
        rows = []
        for label in ("cold", "warm")[: 1 if args.no_warm else 2]:
            request = ConvertRequest(
                model=model, profiles=[get_profile(args.profile)], calib=calib, eval=evaluation,
                out=work / label, key=key, name=args.model, version="1", threads=args.threads, pins=pins,
                report=False, metric=metric, min_score=min_score, cache_dir=work / "cache",
                time_budget_s=args.time_budget,
            )  # fmt: skip
            print(f"== {args.model}: {label} run", file=sys.stderr, flush=True)
            rows.append(run_once(request, label))
    size_mb = model.stat().st_size / 1e6
    document = {"model": args.model, "model_mb": round(size_mb, 2), "profile": args.profile,
                "threads": args.threads, "cpus": os.cpu_count(), "runs": rows}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2))
    _print(f"{args.model} ({size_mb:.1f} MB, {args.profile}, {args.threads} threads, {os.cpu_count()} CPUs)", rows)


if __name__ == "__main__":
    main()
