"""What a bundle needs of a device (`Manifest.resources`, issue 33 item 3): the process memory the loaded model adds
at its peak, on the runtime and provider it was timed on, and the compute of one run.

Memory is measured in a fresh Python process (so nothing this converter holds counts): it imports the runtime, reads
its resident set (the baseline), resets the kernel's high-water mark (/proc/self/clear_refs), loads the model, runs
the golden input for warm-up and then some more, and reads the high-water mark (VmHWM). Added = peak − baseline.
Where the high-water mark cannot be reset, the process's `ru_maxrss` stands in (it can only over-count). A runtime
this host cannot run (CoreML, TensorRT without a GPU, onnxruntime-web) is not measured, and the reason is returned.
A language model (ONNX Runtime GenAI, OpenVINO GenAI) is loaded from its folder and generates GENERATED_TOKENS tokens
a run, so its KV cache counts.
FLOPs are the roofline's count (converter/roofline/work.py) of the artifact that ships, at the golden batch.
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.bundle.manifest import ResourceNeeds

log = logging.getLogger(__name__)

RUNS = 20  # runs after the warm-up: long enough for arenas and caches to reach their size
GENERATED_TOKENS = 64  # a language model's run: a short prompt, then this many tokens (its KV cache grows with them)
RUNTIMES = ("onnxruntime", "openvino", "onnxruntime-genai", "openvino-genai")

_PROBE = r"""
import json, resource, sys
import numpy as np
args = json.loads(sys.argv[1])

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None

runtime = args["runtime"]
if runtime == "openvino":
    import openvino as ov
elif runtime == "openvino-genai":
    import openvino_genai as ovg
elif runtime == "onnxruntime-genai":
    import onnxruntime_genai as og
else:
    import onnxruntime as ort
feeds = dict(np.load(args["feeds"])) if args["feeds"] else {}
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    reset = status("VmHWM") is not None
except OSError:
    reset = False
base_kb = status("VmRSS") or 0
if runtime == "openvino":
    config = {"INFERENCE_NUM_THREADS": args["threads"]} if args["threads"] else {}
    request = ov.Core().compile_model(args["model"], "CPU", config).create_infer_request()
    run = lambda: request.infer(feeds)
elif runtime == "openvino-genai":  # a language model: each run generates TOKENS tokens after a short prompt
    pipeline = ovg.LLMPipeline(args["model"], "CPU")
    run = lambda: pipeline.generate("The device runs several models", max_new_tokens=args["tokens"])
elif runtime == "onnxruntime-genai":
    model = og.Model(args["model"])

    def run():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=8 + args["tokens"])
        generator = og.Generator(model, params)
        generator.append_tokens([1, 2, 3, 4, 5, 6, 7, 8])
        while not generator.is_done():
            generator.generate_next_token()
else:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args["threads"], 1
    options.log_severity_level = 3
    session = ort.InferenceSession(args["model"], options, providers=[args["provider"]])
    run = lambda: session.run(None, feeds)
for _ in range(3 + args["runs"]):
    run()
peak_kb = status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kb": base_kb, "peak_kb": peak_kb, "hwm_reset": reset}))
"""


@dataclass(frozen=True)
class MemoryFigure:
    """One runtime/provider's measurement: MB added at the peak, or why there is none."""

    key: str
    peak_mb: float | None
    reason: str = ""
    timed_out: bool = False  # the measuring process ran past its time and was stopped


def runtime_key(runtime: str, provider: str) -> str:
    """The key of `ResourceNeeds.peak_memory_mb`: runtime/provider (what `peak_mb(runtime)` looks up)."""
    return f"{runtime}/{provider}"


def measure_memory(
    model: Path,
    runtime: str,
    provider: str,
    feeds: Mapping[str, np.ndarray],
    threads: int = 1,
    runs: int = RUNS,
    timeout_s: float = 600.0,
) -> MemoryFigure:
    """The memory `model` adds to a fresh process on `runtime`/`provider` at its peak (load, warm-up, `runs`). A
    language model (`*-genai`: `model` is its folder, `feeds` unused) runs a short prompt and GENERATED_TOKENS
    tokens, 5 times. The process is stopped after `timeout_s` (the figure then says so)."""
    key = runtime_key(runtime, provider)
    if runtime not in RUNTIMES:
        return MemoryFigure(key, None, f"{runtime} does not run on this host")
    if runtime == "onnxruntime":
        import onnxruntime as ort

        if provider not in ort.get_available_providers():
            return MemoryFigure(key, None, f"{provider} is not available on this host")
    with tempfile.TemporaryDirectory(prefix="edgefleet-memory-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz" if feeds else None
        if feeds_path is not None:
            np.savez(feeds_path, **{k: np.asarray(v) for k, v in feeds.items()})  # type: ignore[arg-type]
        generative = runtime.endswith("-genai")
        args = {"runtime": runtime, "provider": provider, "model": str(model), "feeds": str(feeds_path or ""),
                "threads": threads, "runs": 2 if generative else runs, "tokens": GENERATED_TOKENS}  # fmt: skip
        try:
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return MemoryFigure(key, None, f"the measuring process took over {timeout_s:.0f} s", timed_out=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return MemoryFigure(key, None, f"the measuring process failed: {last}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    added_mb = max(0.0, (figures["peak_kb"] - figures["base_kb"]) / 1024)
    return MemoryFigure(key, round(added_mb, 2))


def flops_of(graph: object, feeds: Mapping[str, np.ndarray], hint: str | None = None) -> float | None:
    """One run's FLOPs as the roofline counts them (None where the graph cannot be read)."""
    from edgefleet.converter.roofline import Artifact
    from edgefleet.converter.roofline.candidates import work_of

    try:
        return float(work_of(Artifact("bundle", "", graph, None, hint), feeds).flops)
    except Exception as err:  # a graph the counter cannot read: the bundle says no figure, the conversion goes on
        log.info("no FLOP count: %s: %s", type(err).__name__, err)
        return None


def resource_needs(figures: list[MemoryFigure], flops: float | None) -> ResourceNeeds | None:
    """The manifest's `resources`, or None when nothing was measured (the device then counts the files' size)."""
    measured = {f.key: f.peak_mb for f in figures if f.peak_mb is not None}
    if not measured and flops is None:
        return None
    machine = f"{platform.machine()} {platform.processor() or platform.system()}".strip()
    return ResourceNeeds(peak_memory_mb=measured, flops_per_run=flops, measured_on=machine)


__all__ = ["MemoryFigure", "flops_of", "measure_memory", "resource_needs", "runtime_key"]
