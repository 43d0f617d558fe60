"""What every part of bench/serve.py shares: the bundle under test, the raw runtime call an application would
write, interleaved medians, and the inference API (or any snippet) in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CPU, OV = "CPUExecutionProvider", "openvino:CPU"


def demo_bundle(work: Path, runtimes: tuple[str, ...] | None = None) -> Path:
    digits = REPO / "models" / "digits"
    name = "digits-cnn" if runtimes is None else f"digits-cnn-{'-'.join(runtimes)}"
    return make_bundle(work, digits / "digits_cnn.onnx", digits / "calib.npz", digits / "eval.npz", name, runtimes)


def make_bundle(
    work: Path, model: Path, calib: Path, evaluation: Path, name: str, runtimes: tuple[str, ...] | None = None
) -> Path:
    """Convert `model` for intel-x86-vnni like any user model (only `runtimes`' targets, when given); returns the
    unpacked bundle directory."""
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.bundle.archive import unpack_bundle
    from edgefleet.core.profiles import get_profile
    from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair

    private, public = generate_keypair(work / f"keys-{name}")
    results = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("intel-x86-vnni")], calib=calib, eval=evaluation, out=work,
            key=SigningKey.load(private), name=name, version="1", report=False, runtimes=runtimes,
        )
    )  # fmt: skip
    bundle = work / f"bundle-{name}"
    manifest = unpack_bundle(Path(str(results[0].bundle)), bundle, TrustedKeys.load([public]))
    (bundle / "manifest.json").write_text(manifest.model_dump_json())
    return bundle


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Median per-call µs over rounds; each round runs every function `calls` times, in a rotating order."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up
        for _ in range(calls):
            fns[name]()
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {n: float(np.median(v)) for n, v in times.items()}


def raw_call(model_path: Path, provider: str, threads: int, precision: str) -> Callable[[dict[str, np.ndarray]], Any]:
    """The plain runtime call an application would write, without the agent."""
    if provider.startswith("openvino:"):
        import openvino as ov

        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if precision == "fp32":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        request = ov.Core().compile_model(str(model_path), provider.split(":", 1)[1], config).create_infer_request()
        return lambda feeds: request.infer(feeds, share_inputs=True)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(model_path), options, providers=[provider])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: session.run(names, feeds)


SERVE = """
import sys, time; sys.path.insert(0, {repo!r})
from pathlib import Path
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.api import InferenceService, ServiceConfig
from edgefleet.core.bundle.archive import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
svc = InferenceService([LoadedModel(d, m, {threads})], ServiceConfig(port=0, concurrency={concurrency})).start()
print(svc.port, flush=True); sys.stdin.read(); svc.stop()
"""


def repo_env(repo: Path) -> dict[str, str]:
    """The environment of a process running `repo`'s code: the processes it starts (the agent's measuring worker)
    then run that checkout's code too, whatever PYTHONPATH this bench was started with."""
    return {**os.environ, "PYTHONPATH": str(repo)}


def serve(bundle: Path, threads: int, concurrency: int = 2, repo: Path = REPO) -> tuple[subprocess.Popen[str], int]:
    """The inference API in its own process (as in the agent), from `repo`; returns it and its port."""
    code = SERVE.format(repo=str(repo), bundle=str(bundle), threads=threads, concurrency=concurrency)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=repo_env(repo))  # fmt: skip
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def python(code: str, repo: Path = REPO) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=repo_env(repo))
    return done.stdout.strip()
