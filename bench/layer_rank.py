"""The ORT exclusion search under two layer rankings: qdq_loss_debug's accumulated error (the old ranking: each
activation against the float model's, error carried from upstream) and the local error with float groups
(converter/passes/quantize_local.py, what the converter ranks by now).

For each model: plain ORT INT8 static (U8S8 per-channel, MinMax, ONNX Runtime's defaults otherwise), then the
exclusion search (converter/mixed/float_set.py: float set grown 1, 2, 4, ... then bisected) under each ranking,
its builds confirmed on the selection split of the evaluation set and the variant it settles on scored on the
held-out split (converter/mixed/holdout.py: the seeded split the converter uses). Printed as a table and
written to bench/results/layer_rank.json.

    python bench/layer_rank.py                       # the two constructed models and ppocr-rec
    python bench/layer_rank.py --only outlier-conv   # one of them
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # test helpers: the constructed models, the corpus

from edgefleet.converter.passes import precision as prec  # noqa: E402
from edgefleet.converter.passes.heads import PLUMBING  # noqa: E402
from edgefleet.converter.passes.quantize_local import CARRIES_SCALE, local_report  # noqa: E402
from edgefleet.converter.runners import ort_runner, predict  # noqa: E402
from edgefleet.converter.search.gate import MetricPlan, plan_metric, score  # noqa: E402
from edgefleet.converter.search.holdout import split_indices  # noqa: E402
from edgefleet.converter.search.mixed.float_set import search_float_set  # noqa: E402
from edgefleet.core.errors import ConversionError  # noqa: E402
from edgefleet.core.tensors import Dataset  # noqa: E402

Case = tuple[Path, Path, Path, str, float]  # model, calibration, evaluation, metric, bar
Trial = tuple[onnx.ModelProto, int, int, float]  # the model, its float nodes, of which compute, selection score


def _constructed(work: Path, samples: int) -> dict[str, Callable[[], Case]]:
    from support.models.mixed import outlier_conv_model, outlier_model

    task = ("per-position-agreement", 0.95)
    return {
        "outlier-matmul": lambda: (*outlier_model(work / "matmul", samples), *task),
        "outlier-conv": lambda: (*outlier_conv_model(work / "conv", eval_count=samples), *task),
    }


def _corpus(work: Path, samples: int, name: str) -> Case:
    from support.models import corpus

    model = corpus.by_name(name)
    calib, evaluation = corpus.dataset(model, work / "data", count=samples)
    assert model.metric is not None and model.min_score is not None
    return model.path(), calib, evaluation, model.metric, model.min_score


def _subset(data: Dataset, indices: tuple[int, ...]) -> Dataset:
    index = np.asarray(indices)
    return Dataset({k: v[index] for k, v in data.inputs.items()}, None if data.labels is None else data.labels[index])


def run_case(name: str, case: Case, threads: int) -> dict[str, object]:
    path, calib_path, eval_path, metric, bar = case
    proto = onnx.load(str(path))
    calib, evaluation = (Dataset(dict(np.load(p)), None) for p in (calib_path, eval_path))
    split = split_indices(len(evaluation))
    if split.refused:
        raise SystemExit(f"{name}: {split.refused}")
    parts = {"selection": _subset(evaluation, split.selection), "held-out": _subset(evaluation, split.held_out)}
    fp32 = ort_runner(proto, threads)
    reference = {k: predict(fp32, d) for k, d in parts.items()}
    plan: MetricPlan = plan_metric(reference["selection"], None, metric)

    def scored(model: onnx.ModelProto, part: str) -> float:
        return score(predict(ort_runner(model, threads), parts[part]), reference[part], None, plan).value

    config = prec.StaticConfig()
    plain = prec.quantize_int8_static(proto, config, calib)
    ops = {n.name: n.op_type for n in plain.graph.node}  # Relu/Clip that ORT folded away are absent: not compute
    row: dict[str, object] = {"model": name, "metric": metric, "bar": bar, "samples": len(evaluation),
                              "plain_int8_held_out": scored(plain, "held-out")}  # fmt: skip
    started = time.monotonic()
    accumulated = prec.layer_report(proto, plain, calib, samples=8)
    old = [(w.node,) for w in accumulated.worst(len(accumulated.layers)) if w.node and w.op_type not in PLUMBING]
    rank_s = {"accumulated": time.monotonic() - started}
    started = time.monotonic()
    new = [w.group for w in local_report(proto, plain, calib, samples=8)]
    rank_s["local"] = time.monotonic() - started
    for label, ranked in (("accumulated", list(dict.fromkeys(old))[:64]), ("local", list(dict.fromkeys(new))[:64])):

        def try_count(count: int, ranked: list[tuple[str, ...]] = ranked) -> tuple[Trial, bool]:
            names = tuple(dict.fromkeys(n for layer in ranked[:count] for n in layer))
            model = prec.quantize_int8_static(proto, dataclasses.replace(config, exclude_nodes=names), calib)
            compute = sum(1 for n in names if n in ops and ops[n] not in CARRIES_SCALE)
            selected = scored(model, "selection")
            return (model, len(names), compute, selected), selected >= bar - 1e-12

        started = time.monotonic()
        found = search_float_set(len(ranked), try_count)
        best = found.best
        row[label] = {
            "ranked": len(ranked),
            "first": list(ranked[0]) if ranked else [],
            "rank_s": round(rank_s[label], 2),
            "search_s": round(time.monotonic() - started, 1),
            "builds": [(t.count, round(t.result[3], 4), t.passed) for t in found.trials],
            "float_layers": best.count if best else None,
            "float_nodes": best.result[1] if best else None,
            "float_compute_nodes": best.result[2] if best else None,
            "held_out": scored(best.result[0], "held-out") if best else None,
        }
        print(f"  {name} {label}: {row[label]}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="outlier-matmul, outlier-conv, ppocr-rec (repeatable)")
    parser.add_argument("--samples", type=int, default=32, help="evaluation samples (split in two halves)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "layer_rank.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefleet-rank-") as tmp:
        work = Path(tmp)
        cases = _constructed(work, args.samples) | {"ppocr-rec": lambda: _corpus(work, args.samples, "ppocr-rec")}
        for name, make in cases.items():
            if args.only and name not in args.only:
                continue
            print(f"{name} ...", flush=True)
            try:
                rows.append(run_case(name, make(), args.threads))
            except ConversionError as err:
                rows.append({"model": name, "error": str(err)})
    print()
    print("| model | plain INT8 (held-out) | ranking | first ranked | builds | float layers (nodes, compute nodes) "
          "| held-out | meets |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | failed: {row['error']} |")
            continue
        for label in ("accumulated", "local"):
            found = row[label]
            assert isinstance(found, dict)
            layers = (
                f"{found['float_layers']} ({found['float_nodes']}, {found['float_compute_nodes']})"
                if found["float_layers"]
                else "none met it"
            )
            held = found["held_out"]
            meets = "—" if held is None else ("yes" if held >= float(row["bar"]) - 1e-12 else "no")  # type: ignore[arg-type]
            print(f"| {row['model']} ({row['metric']} ≥ {row['bar']}) | {float(row['plain_int8_held_out']):.4f} | "  # type: ignore[arg-type]
                  f"{label} | {', '.join(found['first'][:3])} | {len(found['builds'])} | {layers} | "
                  f"{'—' if held is None else f'{held:.4f}'} | {meets} |")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"samples": args.samples, "threads": args.threads, "rows": rows}, indent=2))
    print(f"\nwritten {args.json}")


if __name__ == "__main__":
    main()
