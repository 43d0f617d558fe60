"""Benchmark: generation with edgefleet's chosen bundle, served through the agent's local API, beside the standard
recipes, in one run at 2 threads, interleaved rounds, medians.

Standard recipes, built here from the Hugging Face model with the converter's own builders:

- **ORT GenAI FP32**: ONNX Runtime GenAI's model builder `-p fp32`.
- **ORT GenAI INT4 (builder defaults)**: `-p int4` with no extra options (0.18: the quantizer's default RTN,
  symmetric, block 32, accuracy level 4 on the CPU; the table says what the graph holds).
- **OpenVINO GenAI INT4 (optimum-intel's default)**: what `optimum-cli export openvino --weight-format int4` does for
  a model without its own config: optimum-intel's `_DEFAULT_4BIT_WQ_CONFIG` (bits 4, sym False, group_size 128,
  ratio 1.0, all_layers None: NNCF's INT4_ASYM, its INT8_ASYM backup for the embedding and head). optimum-intel
  cannot be installed beside transformers 5, so: the converter's stateful export, then NNCF `compress_weights`
  with those settings, run with OpenVINO's own CPU defaults (only the thread count is set).

Against them the bundle edgefleet chose: models/tinylm converted for intel-x86-vnni and generic-x86-64 with the
converter's API, the bundle of this host's most specific profile (or `--bundle` with `--trust`). It is timed bare
(the converter's runner on the bundle's folder), raw (the agent's session in process, as
bench/generation_serving.py measures) and served by the agent's service in its own process (Triton
generate_stream read from a socket, and the official `openai` client), with bench/generation_serving.py's code.

Every row: TTFT for a 64-token prompt cut from the held-out text (the same token ids for all; the Triton row sends
their text, checked to encode back to them), TPOT over `--output-tokens` (end tokens ignored), perplexity and
next-token agreement against FP32 in transformers on the same judged held-out tokens (converter/generative/judge.py),
size on disk of the folder the runtime loads, and tokens/s as a share of the bandwidth limit (read bandwidth
measured here ÷ weights read per token; converter/generative/limit.py). Goals: the chosen bundle ≤ 1.0× the TPOT of
the fastest standard recipe inside the converter's default bars; serving costs ≤ 3 % of raw tokens/s and ≤ 5 ms of
TTFT.

    python bench/generate.py [--threads 2] [--rounds 20] [--runs 5] [--output-tokens 64] [--json PATH]
    python bench/generate.py --bundle B.tar --trust KEY.pub        # an existing bundle instead of converting
    python bench/record.py generate -- python bench/generate.py --json bench/results/generate.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (the FP32 reference, the exports)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import generation_serving as serving

from edgefleet.converter.generative.bars import (
    DEFAULT_MAX_PERPLEXITY_RATIO,
    DEFAULT_MIN_NEXT_TOKEN_AGREEMENT,
    DEFAULT_PROMPT_TOKENS,
    QualityBars,
)
from edgefleet.converter.generative.builders import Artifact, Builder
from edgefleet.converter.generative.candidates import BuildRecipe
from edgefleet.converter.generative.judge import Reference, Scores, reference_of, score
from edgefleet.converter.generative.limit import limit_of, read_bandwidth, weights_read_per_token
from edgefleet.converter.generative.runtimes import REFERENCE, TimedGeneration, open_runner
from edgefleet.converter.generative.source import DecoderSource, load_decoder
from edgefleet.converter.generative.text import load_text
from edgefleet.converter.generative.timing import TokenTimes, interleaved
from edgefleet.converter.timing.latency import SETTLE_IDLE, SETTLE_MAX_S, SETTLE_QUIET, SETTLE_WINDOW_S
from edgefleet.core.bundle.manifest import Manifest

REPO = Path(__file__).resolve().parent.parent
TINYLM = REPO / "models" / "tinylm"
PROFILES = ("intel-x86-vnni", "generic-x86-64")
MAX_SERVED_COST = 0.03  # served tokens/s at least 97 % of raw
MAX_SERVED_TTFT_MS = 5.0
OPTIMUM_SOURCE = (
    "huggingface/optimum-intel e1de5bee: optimum/intel/openvino/configuration.py _DEFAULT_4BIT_WQ_CONFIG "
    "{bits 4, ratio 1.0, sym False, group_size 128, all_layers None}, used by optimum/commands/export/openvino.py "
    "for --weight-format int4 without other options; OVWeightQuantizationConfig.to_nncf_dict → "
    "nncf.compress_weights(mode=INT4_ASYM, ratio=1.0, group_size=128, all_layers=None, backup_mode=None → INT8_ASYM)"
)
STANDARD = {  # name → (runtime, recipe key, what it is)
    "ORT GenAI FP32": ("onnxruntime-genai", "builder-fp32", "GenAI model builder -p fp32, CPU"),
    "ORT GenAI INT4 (builder defaults)": ("onnxruntime-genai", "builder-int4", "GenAI model builder -p int4, CPU, "
                                          "no extra options"),
    "OpenVINO GenAI INT4 (optimum default)": ("openvino-genai", "ov-int4-optimum", "stateful IR + NNCF INT4_ASYM, "
                                              "group 128, ratio 1.0; OpenVINO's CPU defaults"),
}  # fmt: skip


def _recipes() -> dict[str, BuildRecipe]:
    export = BuildRecipe(key="ov-fp32-export", method="ov-export", params={"weights": "f32"}, needs=("hf",))
    return {
        "builder-fp32": BuildRecipe(key="builder-fp32", method="ort-builder", needs=("hf",),
                                    params={"precision": "fp32", "execution_provider": "cpu"}),
        "builder-int4": BuildRecipe(key="builder-int4", method="ort-builder", needs=("hf",),
                                    params={"precision": "int4", "execution_provider": "cpu"}),
        "ov-int4-optimum": BuildRecipe(key="ov-int4-optimum", method="ov-nncf", base=export,
                                       params={"mode": "INT4_ASYM", "group_size": 128, "ratio": 1.0}),
    }  # fmt: skip


@dataclass
class Row:
    """One timed line of the table: a runner, the folder its runtime loads and its scores."""

    name: str
    kind: str  # "standard" or "edgefleet"
    path: str  # how it is called
    runtime: str
    folder: Path
    runner: Any  # a GenerativeRunner, or AgentRaw / Served (timed and, in process, logits)
    scores: Scores | None = None
    times: TokenTimes | None = None


# --- the bundle: converted here, or given ---------------------------------------------------------------------------


def convert_tinylm(work: Path, threads: int) -> tuple[Path, Path, dict[str, Any]]:
    """models/tinylm for PROFILES with the converter's API: (the bundle of this host's profile, the public key,
    what each profile chose)."""
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import detect_profiles, get_profile
    from edgefleet.core.trust.signing import SigningKey, generate_keypair

    private, public = generate_keypair(work / "keys")
    started = time.monotonic()
    results = convert(
        ConvertRequest(
            model=TINYLM / "model", profiles=[get_profile(p) for p in PROFILES], calib=TINYLM / "calib.txt",
            eval=TINYLM / "heldout.txt", out=work / "bundles", key=SigningKey.load(private), name="tinylm",
            version="1", threads=threads, report=False,
        ),
        progress=lambda msg: print(f"   convert: {msg}", file=sys.stderr, flush=True),
    )  # fmt: skip
    seconds = time.monotonic() - started
    failed = {r.profile: r.error for r in results if not r.bundle}
    if failed:
        raise SystemExit(f"generate: the converter made no bundle for {failed}")
    here = [p.name for p in detect_profiles()]
    chosen = next((r for name in here for r in results if r.profile == name), results[0])
    about = {
        "conversion_s": round(seconds, 1),
        "profile": chosen.profile,
        "host_profiles": here,
        "choices": {r.profile: {"recipe": r.recipe, "runtime": r.runtime, "tpot_ms_at_conversion": r.latency_ms}
                    for r in results},
    }  # fmt: skip
    return Path(str(chosen.bundle)), public, about


def unpack(bundle: Path, trust: Path, work: Path) -> tuple[Path, Manifest]:
    from edgefleet.core.bundle.archive import unpack_bundle
    from edgefleet.core.trust.signing import TrustedKeys

    manifest = unpack_bundle(bundle, work / "bundle", TrustedKeys.load([trust]))
    (work / "bundle" / "manifest.json").write_text(manifest.model_dump_json())  # as the served side reads it
    return work / "bundle", manifest


# --- the bundle's runners: raw in the agent, and served -----------------------------------------------------------


class AgentRaw:
    """The bundle's runtime as the agent runs it, in process: its session's `generate` (generation_serving.raw)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        ttft, tpot = serving.raw(self.model, new_tokens, [int(i) for i in ids])
        return TimedGeneration(ttft, tpot, new_tokens)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return self.model.generative.session.logits([int(i) for i in ids])


class Served:
    """A stream from the agent's service in its own process. After the last generation of each of `interleaved`'s
    blocks (one untimed, then `runs`), waits until the service's process is quiet, as `settle` waits for this
    process's threads: its runtime's workers spin after a generation and would slow the next block's runner."""

    def __init__(self, call: Callable[[int], tuple[float, float]], pid: int, runs: int) -> None:
        self.call, self.pid, self.block, self.calls = call, pid, runs + 1, 0

    def timed(self, ids: np.ndarray, new_tokens: int) -> TimedGeneration:
        ttft, tpot = self.call(new_tokens)
        self.calls += 1
        if self.calls % self.block == 0:
            _quiet(self.pid)
        return TimedGeneration(ttft, tpot, new_tokens)


def _quiet(pid: int) -> None:
    def cpu_ns() -> int:
        total = 0
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total

    start = time.monotonic()
    before, since, quiet = cpu_ns(), start, 0
    while time.monotonic() - start < SETTLE_MAX_S and quiet < SETTLE_QUIET:
        time.sleep(SETTLE_WINDOW_S)
        now, at = cpu_ns(), time.monotonic()
        quiet = quiet + 1 if now - before < SETTLE_IDLE * (at - since) * 1e9 else 0
        before, since = now, at


# --- what each artifact is --------------------------------------------------------------------------------------------


def describe(folder: Path, runtime: str) -> str:
    """The weight formats the artifact's graph holds (what 'the defaults' gave)."""
    if runtime == "onnxruntime-genai":
        import onnx

        config = json.loads((folder / "genai_config.json").read_text("utf-8"))
        graph = onnx.load(str(folder / config["model"]["decoder"]["filename"]), load_external_data=False).graph
        found: dict[str, int] = {}
        for node in graph.node:
            if node.op_type in ("MatMulNBits", "GatherBlockQuantized"):
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                key = f"{node.op_type}(bits {attrs.get('bits', 4)}, block {attrs.get('block_size')}" + (
                    f", accuracy_level {attrs.get('accuracy_level', 0)})" if node.op_type == "MatMulNBits" else ")"
                )
                found[key] = found.get(key, 0) + 1
            elif node.op_type in ("MatMul", "Gather") and any(i.name in node.input for i in graph.initializer):
                found[f"{node.op_type} fp32"] = found.get(f"{node.op_type} fp32", 0) + 1
        return ", ".join(f"{n} x {k}" for k, n in found.items()) or "no weight MatMuls"
    import openvino as ov

    model = ov.Core().read_model(str(folder / "openvino_model.xml"))
    kinds: dict[str, int] = {}
    for op in model.get_ops():
        if op.get_type_name() == "Constant" and op.get_byte_size() >= 1024:
            kind = op.get_element_type().get_type_name()
            kinds[kind] = kinds.get(kind, 0) + 1
    return "constants of 1 KB or more: " + ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))


def openvino_cpu_defaults(folder: Path, threads: int) -> dict[str, str]:
    """What OpenVINO's CPU plugin compiles the IR with when given only the thread count (this CPU's defaults)."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(folder / "openvino_model.xml"), "CPU", {"INFERENCE_NUM_THREADS": threads})
    found = {}
    for name in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE"):
        try:
            value = compiled.get_property(name)
            found[name] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
        except RuntimeError as err:
            found[name] = f"unreadable: {str(err).splitlines()[0][:80]}"
    return found


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# --- the run --------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    parser.add_argument("--runs", type=int, default=5, help="timed generations per runner per round (default 5)")
    parser.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--bundle", type=Path, help="a signed generative bundle of models/tinylm (else: converted)")
    parser.add_argument("--trust", type=Path, help="the public key that signed --bundle")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.bundle is not None and args.trust is None:
        parser.error("--bundle needs --trust KEY.pub")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        document = run(args, Path(tmp))
    document["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    print_table(document)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def log(message: str) -> None:
    print(f"== {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import openai

    from edgefleet.agent.runtime.model import LoadedModel

    for logger in ("httpx", "httpx2"):  # the openai client's transport logs every request at INFO
        logging.getLogger(logger).setLevel(logging.WARNING)

    threads = args.threads
    source = load_decoder(TINYLM / "model")
    text = load_text(source.path / "tokenizer.json", TINYLM / "calib.txt", TINYLM / "heldout.txt",
                     source.context_length)  # fmt: skip
    prompt = text.prompt(args.prompt_tokens)
    about: dict[str, Any] = {}
    if args.bundle is None:
        log(f"converting models/tinylm for {', '.join(PROFILES)} at {threads} threads (the converter's API)")
        bundle, trust, about = convert_tinylm(work, threads)
    else:
        bundle, trust = args.bundle, args.trust
    bundle_dir, manifest = unpack(bundle, trust, work)
    spec = manifest.generation
    assert spec is not None, f"{bundle} is not a generative bundle"
    model_dir = bundle_dir / spec.model_dir
    chosen = manifest.recipe.name

    log("building the standard recipes (the converter's builders)")
    builder = Builder(source, text.calibration(), work / "standard", threads)
    artifacts: dict[str, Artifact] = {}
    for name, (_runtime, key, _how) in STANDARD.items():
        artifact = builder.build(_recipes()[key])
        if artifact.folder is None:
            raise SystemExit(f"generate: building {name} failed: {artifact.error}")
        artifacts[name] = artifact

    log(f"FP32 reference in transformers on {len(text.judged())} held-out windows")
    reference_runner = open_runner(REFERENCE, source.path, threads, source.eos_token_ids)
    reference = reference_of(reference_runner, text.judged())
    reference_runner.close()

    rows: list[Row] = []
    for name, (runtime, _key, how) in STANDARD.items():
        folder = artifacts[name].folder
        assert folder is not None
        runner = open_runner(runtime, folder, threads, source.eos_token_ids)  # OpenVINO: its own CPU defaults
        rows.append(Row(name, "standard", f"in process ({how})", runtime, folder, runner))
    bare = open_runner(spec.runtime, model_dir, threads, source.eos_token_ids, dict(spec.runtime_config))
    rows.append(Row(f"edgefleet: {chosen}, bare runtime", "edgefleet", "in process (the converter's runner)",
                    spec.runtime, model_dir, bare))  # fmt: skip
    loaded = LoadedModel(bundle_dir, manifest, threads)
    agent_raw = AgentRaw(loaded)
    rows.append(Row(f"edgefleet: {chosen}, agent raw", "edgefleet", "in process (the agent's session)",
                    spec.runtime, model_dir, agent_raw))  # fmt: skip

    log("judging every row against FP32 on the same tokens")
    for row in rows:
        row.scores = score(row.runner, reference)
    served_scores = rows[-1].scores  # the agent's session: what the service runs

    log("starting the agent's service in its own process")
    server, port = serving.start_server(bundle_dir, threads, work)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        ids = [int(i) for i in prompt]
        prompt_text = loaded.generative.decode(ids)
        served_name = manifest.model_name
        openai_call = Served(lambda n: serving.openai_stream(client, served_name, n, ids), server.pid, args.runs)
        rows.append(Row(f"edgefleet: {chosen}, served", "edgefleet", "agent service, openai client stream (token ids)",
                        spec.runtime, model_dir, openai_call, served_scores))  # fmt: skip
        text_round_trips = loaded.generative.encode(prompt_text) == ids
        if text_round_trips:
            triton_call = Served(lambda n: serving.triton_stream(port, served_name, n, prompt_text), server.pid,
                                 args.runs)  # fmt: skip
            rows.append(Row(f"edgefleet: {chosen}, served", "edgefleet", "agent service, Triton generate_stream (text)",
                            spec.runtime, model_dir, triton_call, served_scores))  # fmt: skip
        log(f"timing {len(rows)} rows: {args.rounds} interleaved rounds of {args.runs} generations, "
            f"{args.prompt_tokens}-token prompt, {args.output_tokens} tokens")  # fmt: skip
        runners = {f"{r.name} [{r.path}]": r.runner for r in rows}
        times = interleaved(runners, prompt, args.output_tokens, rounds=args.rounds, runs=args.runs,
                            on_round=lambda done, total: log(f"round {done}/{total}"))  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
    for row in rows:
        row.times = times[f"{row.name} [{row.path}]"]
        if hasattr(row.runner, "close"):
            row.runner.close()
    loaded.close()

    log("read bandwidth at the same threads")
    bandwidth = read_bandwidth(threads)
    document = figures(rows, reference, bandwidth, source)
    document["meta"] = {
        "model": "models/tinylm (918,656 parameters, Llama, vocab 1024)",
        "threads": threads,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "judged_tokens": reference.tokens,
        "reference_perplexity": round(reference.perplexity, 4),
        "bars": {"max_perplexity_ratio": DEFAULT_MAX_PERPLEXITY_RATIO,
                 "min_next_token_agreement": DEFAULT_MIN_NEXT_TOKEN_AGREEMENT},
        "read_bandwidth_gb_s": bandwidth.gb_s,
        "bandwidth_method": bandwidth.method,
        "bundle": {"id": manifest.bundle_id, "recipe": chosen, "runtime": spec.runtime, "provider": loaded.provider,
                   "runtime_config": dict(spec.runtime_config), "archive_bytes": bundle.stat().st_size, **about},
        "recipes": {name: describe(artifacts[name].folder, runtime)  # type: ignore[arg-type]
                    for name, (runtime, _k, _h) in STANDARD.items()} | {f"edgefleet: {chosen}": describe(model_dir,
                                                                                                  spec.runtime)},
        "openvino_cpu_defaults": openvino_cpu_defaults(artifacts["OpenVINO GenAI INT4 (optimum default)"].folder,
                                                       threads),  # type: ignore[arg-type]
        "optimum_intel_defaults_from": OPTIMUM_SOURCE,
        "triton_prompt": "the prompt's text, which encodes back to the same ids" if text_round_trips else
                         "left out: the prompt's text does not encode back to the same ids",
        "versions": {p: importlib.metadata.version(p) for p in ("onnxruntime-genai", "onnxruntime", "openvino",
                                                                "openvino-genai", "nncf", "openai")},
    }  # fmt: skip
    return {"meta": document.pop("meta"), **document}


def figures(rows: list[Row], reference: Reference, bandwidth: Any, source: DecoderSource) -> dict[str, Any]:
    bars = QualityBars()
    out: list[dict[str, Any]] = []
    for row in rows:
        assert row.scores is not None and row.times is not None
        weights = weights_read_per_token(row.folder, row.runtime, source.vocab_size)
        limit = limit_of(weights, bandwidth, row.times.tpot_ms)
        out.append({
            "recipe": row.name, "kind": row.kind, "path": row.path, "runtime": row.runtime,
            "ttft_ms": round(row.times.ttft_ms, 3), "tpot_ms": round(row.times.tpot_ms, 4),
            "tpot_p90_ms": round(row.times.tpot_p90_ms, 4), "tokens_per_s": round(1000 / row.times.tpot_ms, 1),
            "perplexity": round(row.scores.perplexity, 4), "perplexity_ratio": round(row.scores.perplexity_ratio, 4),
            "next_token_agreement": round(row.scores.agreement, 4),
            "meets_bars": bars.refusal(row.scores.perplexity_ratio, row.scores.agreement) is None,
            "size_kb": round(folder_bytes(row.folder) / 1e3, 1), "weights_read_kb": round(weights / 1e3, 1),
            "limit_tokens_per_s": round(limit.limit_tokens_per_s), "pct_of_limit": round(100 * limit.share, 1),
        })  # fmt: skip
    passing = [r for r in out if r["kind"] == "standard" and r["meets_bars"]]
    fastest = min(passing, key=lambda r: r["tpot_ms"]) if passing else None
    for r in out:
        r["vs_fastest_passing_standard"] = round(r["tpot_ms"] / fastest["tpot_ms"], 3) if fastest else None
    return {"rows": out, "goals": goals(out, fastest), "where_the_time_goes": attribution(out)}


def goals(rows: list[dict[str, Any]], fastest: dict[str, Any] | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    raw = next(r for r in rows if r["path"].startswith("in process (the agent"))
    for r in rows:
        if r["kind"] != "edgefleet":
            continue
        ratio = r["vs_fastest_passing_standard"]
        found.append({
            "goal": "TPOT ≤ 1.0x the fastest standard recipe inside the bars", "row": f"{r['recipe']} [{r['path']}]",
            "against": fastest["recipe"] if fastest else "no standard recipe passes the bars",
            "value": ratio, "bar": 1.0, "met": bool(ratio is not None and ratio <= 1.0 and r["meets_bars"]),
        })  # fmt: skip
    for r in rows:
        if not r["path"].startswith("agent service"):
            continue
        cost = 1 - r["tokens_per_s"] / raw["tokens_per_s"]
        extra = r["ttft_ms"] - raw["ttft_ms"]
        found += [
            {"goal": "serving costs ≤ 3 % of raw tokens/s", "row": r["path"], "against": "agent raw",
             "value": round(100 * cost, 1), "bar": 100 * MAX_SERVED_COST, "met": cost <= MAX_SERVED_COST},
            {"goal": "serving adds ≤ 5 ms of TTFT", "row": r["path"], "against": "agent raw",
             "value": round(extra, 3), "bar": MAX_SERVED_TTFT_MS, "met": extra <= MAX_SERVED_TTFT_MS},
        ]  # fmt: skip
    return found


def attribution(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per output token and for the first token, what each layer adds over the one below it: the agent's session
    over the bare runtime (token fetch, detokenizing stream, clock), each served protocol over the agent's session."""
    edgefleet = [r for r in rows if r["kind"] == "edgefleet"]
    steps = [(edgefleet[0], edgefleet[1])] + [(edgefleet[1], r) for r in edgefleet[2:]]
    return [
        {"layer": r["path"], "over": below["path"], "tpot_added_ms": round(r["tpot_ms"] - below["tpot_ms"], 4),
         "tpot_added_pct": round(100 * (r["tpot_ms"] / below["tpot_ms"] - 1), 1),
         "ttft_added_ms": round(r["ttft_ms"] - below["ttft_ms"], 3)}
        for below, r in steps
    ]  # fmt: skip


def print_table(document: dict[str, Any]) -> None:
    meta = document["meta"]
    print(f"tinylm, {meta['threads']} threads, {meta['prompt_tokens']}-token prompt, {meta['output_tokens']} tokens, "
          f"{meta['rounds']} rounds x {meta['runs_per_round']} (medians); FP32 perplexity "
          f"{meta['reference_perplexity']} on {meta['judged_tokens']} tokens; read bandwidth "
          f"{meta['read_bandwidth_gb_s']} GB/s")  # fmt: skip
    print(f"bundle {meta['bundle']['id']} ({meta['bundle']['recipe']}, {meta['bundle']['provider']})")
    head = (f"{'recipe':<40} {'path':<48} {'TTFT ms':>8} {'TPOT ms':>8} {'tok/s':>7} {'ppl':>8} {'ppl x':>7} "
            f"{'next-tok':>8} {'bars':>4} {'KB':>7} {'%limit':>6} {'vs std':>6}")  # fmt: skip
    print(head)
    for r in document["rows"]:
        print(f"{r['recipe'][:40]:<40} {r['path'][:48]:<48} {r['ttft_ms']:>8.3f} {r['tpot_ms']:>8.4f} "
              f"{r['tokens_per_s']:>7.0f} {r['perplexity']:>8.4f} {r['perplexity_ratio']:>7.4f} "
              f"{r['next_token_agreement']:>8.4f} {'yes' if r['meets_bars'] else 'no':>4} {r['size_kb']:>7.1f} "
              f"{r['pct_of_limit']:>6.1f} {r['vs_fastest_passing_standard'] or float('nan'):>6.3f}")  # fmt: skip
    print("goals:")
    for g in document["goals"]:
        print(f"  {g['goal']}: {g['row']} vs {g['against']}: {g['value']} (bar {g['bar']}) "
              f"{'met' if g['met'] else 'NOT MET'}")  # fmt: skip
    print("where the time goes (added by each layer over the one below):")
    for a in document["where_the_time_goes"]:
        print(f"  {a['layer']} over {a['over']}: TPOT {a['tpot_added_ms']:+.4f} ms ({a['tpot_added_pct']:+.1f} %), "
              f"TTFT {a['ttft_added_ms']:+.3f} ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
