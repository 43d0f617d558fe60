"""Sections 3 and 4 of bench/serve.py: the idle memory of a process serving a model through the agent against a
bare onnxruntime process, and the time from a bundle directory to the first answer. Each figure comes from a
fresh child process (the snippets below), so nothing this process has imported or cached counts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.core.bundle.archive import parse_manifest
from edgefleet.core.bundle.manifest import Manifest
from serving.setup import CPU, OV, REPO, python, repo_env

RSS_BARE = """
import sys, time, psutil, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = {threads}; o.inter_op_num_threads = 1
s = ort.InferenceSession({model!r}, o, providers=["CPUExecutionProvider"])
s.run(None, {{"input": np.zeros({shape}, np.float32)}}); time.sleep(1.0)
print(psutil.Process().memory_info().rss)
"""

RSS_AGENT = """
import sys, time, psutil, numpy as np; sys.path.insert(0, {repo!r})
from pathlib import Path
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.runtime import Policy
from edgefleet.agent.api import InferenceService, ServiceConfig
from edgefleet.core.bundle.archive import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
m = m.model_copy(update={{"providers": {providers!r}}})
model = LoadedModel(d, m, {threads}, cache_dir=Path({cache!r}), policy=Policy(measure_in_worker={worker!r}))
model.check_golden(); model.run({{"input": np.zeros({shape}, np.float32)}})
svc = InferenceService([model], ServiceConfig(port=0)).start()
if {scrape!r}:  # one /metrics scrape, over a plain socket (urllib would add its own imports)
    import socket; c = socket.create_connection(("127.0.0.1", svc.port))
    c.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    while c.recv(65536): pass
time.sleep(1.0)
print(psutil.Process().memory_info().rss, model.provider)
"""

FIRST_ANSWER = """
import json, sys, time; sys.path.insert(0, {repo!r})
import numpy as np
from pathlib import Path
from edgefleet.agent.runtime import RuntimeOptions
from edgefleet.core.bundle.archive import parse_manifest
d = Path({bundle!r}); m = parse_manifest((d / "manifest.json").read_text())
m = m.model_copy(update={{"providers": {providers!r}}})
runtime = RuntimeOptions({threads}, Path({cache!r}))
worker_ready_s = None
if {prestart!r}:  # as the agent does when it accepts the offer; waiting for it stands for the download it overlaps
    from edgefleet.agent.runtime.selection import process as selection_process
    start = time.perf_counter(); assert runtime.prestart(m)
    assert selection_process._SLOT[0].ready.wait(300); worker_ready_s = time.perf_counter() - start
start = time.perf_counter()
model = runtime.load(d, m); assert model.check_golden().passed
model.run({{"input": np.zeros({shape}, np.float32)}})
print(json.dumps({{"seconds": time.perf_counter() - start, "provider": model.provider,
                  "worker_ready_s": worker_ready_s}}), flush=True)
"""


def bench_rss(
    bundle: Path, manifest: Manifest, threads: int, work: Path, baseline: Path | None, rounds: int = 3
) -> dict[str, Any]:
    """Idle RSS of each case above a bare onnxruntime process with the same model: each case in a fresh process,
    `rounds` times in a rotating order (the bare process among them), medians."""
    shape = tuple(d if isinstance(d, int) else 1 for d in manifest.inputs[0].shape)
    model = str(bundle / manifest.model_path)
    cache = work / "rss-cache"

    def agent(repo: Path, folder: Path, worker: bool, scrape: bool) -> str:
        return RSS_AGENT.format(repo=str(repo), bundle=str(bundle), providers=[CPU, OV], threads=threads,
                                cache=str(folder), shape=shape, worker=worker, scrape=scrape)  # fmt: skip

    python(agent(REPO, cache, True, False))  # fills the decision cache
    cases: dict[str, tuple[Callable[[int], str], Path]] = {  # name: (the snippet of round i, the checkout)
        "bare onnxruntime": (lambda i: RSS_BARE.format(model=model, shape=shape, threads=threads), REPO),
        "agent, decision cached": (lambda i: agent(REPO, cache, True, False), REPO),
        "agent, decision cached, after one /metrics scrape": (lambda i: agent(REPO, cache, True, True), REPO),
        # the default measures candidates out of process; the last case in the agent's own process, as before
        "agent, cold selection (CPU EP + OpenVINO measured in a worker)": (
            lambda i: agent(REPO, work / f"rss-cold-worker-{i}", True, False), REPO),
        "agent, cold selection (CPU EP + OpenVINO measured in-process)": (
            lambda i: agent(REPO, work / f"rss-cold-here-{i}", False, False), REPO),
    }  # fmt: skip
    if baseline is not None:  # the same process from another checkout (e.g. before a change), cache filled first
        other = baseline.resolve()
        python(agent(other, work / "rss-baseline", True, False), other)
        for scrape in (False, True):
            name = f"agent from {baseline}, decision cached{', after one /metrics scrape' if scrape else ''}"
            cases[name] = (lambda i, s=scrape: agent(other, work / "rss-baseline", True, s), other)  # type: ignore[misc]
    names = list(cases)
    found: dict[str, list[int]] = {name: [] for name in names}
    providers: dict[str, str] = {}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            snippet, checkout = cases[name]
            rss, *rest = python(snippet(index), checkout).split()
            found[name].append(int(rss))
            providers[name] = rest[0] if rest else ""
    bare = float(np.median(found.pop("bare onnxruntime")))
    result: dict[str, Any] = {"bare_onnxruntime_mb": bare / 2**20, "rounds": rounds}
    for name, values in found.items():
        rss_bytes = float(np.median(values))
        each = [(v - bare) / 2**20 for v in values]
        result[name] = {"rss_mb": rss_bytes / 2**20, "over_bare_mb": (rss_bytes - bare) / 2**20,
                        "provider": providers[name], "over_bare_each_mb": each}  # fmt: skip
    return result


def bench_first_answer(
    bundles: dict[str, Path], threads: int, work: Path, baseline: Path | None, rounds: int = 5
) -> dict[str, Any]:
    """Bundle directory → first answer, each try in a fresh process: cold (no cached decision, a fresh cache each try),
    and for a fresh process also with the decision cached (an agent's restart: a cache filled once before the
    rounds); "running agent" times from after the imports, "fresh process" from the interpreter's start (here).
    With `baseline`, the same code from that checkout in the same rounds, interleaved; medians."""
    repos = {"": REPO} | ({" [baseline]": baseline.resolve()} if baseline is not None else {})
    cases: list[tuple[str, str, Path, list[str], bool, str]] = []  # name, repo, bundle, providers, prestart, clock
    cached: dict[str, Path] = {}  # case name -> a cache holding its decision (filled once, before the rounds)
    for label, bundle in bundles.items():
        manifest = parse_manifest((bundle / "manifest.json").read_text())
        for providers, what in ((list(manifest.providers), "its own providers"), ([CPU, OV], "CPU EP + OpenVINO")):
            for tag in repos:
                cases.append((f"running agent, {label}, {what}{tag}", tag, bundle, providers, False, "in"))
        for tag in repos:
            cases.append((f"fresh process, {label}, CPU EP + OpenVINO{tag}", tag, bundle, [CPU, OV], False, "out"))
            name = f"fresh process, {label}, CPU EP + OpenVINO, decision cached{tag}"  # an agent's restart
            cases.append((name, tag, bundle, [CPU, OV], False, "out"))
            cached[name] = work / f"first-cached-{len(cached)}"
        cases.append((f"running agent, {label}, CPU EP + OpenVINO, worker started at the offer", "", bundle,
                      [CPU, OV], True, "in"))  # fmt: skip
    seconds: dict[str, list[float]] = {case[0]: [] for case in cases}
    ready: list[float] = []

    def snippet(name: str, tag: str, bundle: Path, providers: list[str], prestart: bool, index: int) -> str:
        manifest = parse_manifest((bundle / "manifest.json").read_text())
        shape = tuple(d if isinstance(d, int) else 1 for d in manifest.inputs[0].shape)
        cache = cached.get(name, work / f"first-{len(ready)}-{abs(hash((name, index)))}")
        return FIRST_ANSWER.format(repo=str(repos[tag]), bundle=str(bundle), providers=providers, threads=threads,
                                   cache=str(cache), shape=shape, prestart=prestart)  # fmt: skip

    for name, tag, bundle, providers, prestart, _ in cases:  # the decisions the cached cases start from
        if name in cached:
            subprocess.run([sys.executable, "-c", snippet(name, tag, bundle, providers, prestart, -1)],
                           capture_output=True, check=True, env=repo_env(repos[tag]))  # fmt: skip
    for index in range(rounds):
        for name, tag, bundle, providers, prestart, clock in cases[index % len(cases) :] + cases[: index % len(cases)]:
            code = snippet(name, tag, bundle, providers, prestart, index)
            start = time.perf_counter()
            child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=repo_env(repos[tag]))  # fmt: skip
            total = time.perf_counter() - start
            report = json.loads(child.stdout.strip().splitlines()[-1])
            seconds[name].append(total if clock == "out" else float(report["seconds"]))
            if report.get("worker_ready_s") is not None:
                ready.append(float(report["worker_ready_s"]))
    result: dict[str, Any] = {name: float(np.median(values)) for name, values in seconds.items()}
    if ready:
        result["measuring worker start (imports), overlapped with the download when started at the offer"] = float(
            np.median(ready)
        )
    return result
