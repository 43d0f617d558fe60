"""Signing a chosen candidate as a bundle: its artifacts, the golden set and its per-output checks (the device's
golden check, edgefleet.core.quality), the drift reference, and the manifest (recipe, passes, accuracy, latency,
the search that chose it). Files appear in `out` only when complete (packed, then renamed)."""

from __future__ import annotations

import hashlib
import logging
import platform
import shutil
import time
from pathlib import Path
from typing import cast

import numpy as np

from edgefleet.converter import deadline
from edgefleet.converter.onnx_graph import opset_of, tensor_spec
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import web
from edgefleet.converter.request import ConvertRequest
from edgefleet.converter.resources import flops_of, measure_memory, resource_needs
from edgefleet.converter.search import (
    Built,
    ProfileSearch,
    SearchRequest,
    TargetStatus,
    accuracy_report,
    latency_report,
    search_report,
)
from edgefleet.converter.search.golden_gate import golden_figures, golden_of
from edgefleet.core.bundle.archive import describe_files, pack_bundle, sha256_file
from edgefleet.core.bundle.manifest import (
    FarmReport,
    LatencyReport,
    Manifest,
    Precision,
    Recipe,
    ResourceNeeds,
    WebOptions,
)
from edgefleet.core.profiles import Target
from edgefleet.core.quality.drift_stats import build_reference

DRIFT_REFERENCE = "drift_reference.json"

log = logging.getLogger(__name__)


def write_bundle(
    request: ConvertRequest,
    inputs: SearchRequest,
    work: Path,
    found: ProfileSearch,
    built: Built,
    target: Target,
    status: TargetStatus,
    on_devices: FarmReport | None = None,
    benchmark_only: bool = False,
    finish_by: float | None = None,
) -> tuple[Path, str]:
    """Sign `built` as the profile's bundle, or as a benchmark-only candidate for the devices to measure; returns
    the bundle's path and id. `finish_by` (time.monotonic(), --time-budget's end): the peak-memory probe runs only
    in the time left before it, and says so where it did not."""
    assert built.outputs is not None and built.score is not None and built.prepared.model is not None
    profile = found.profile
    evaluation = inputs.evaluation
    golden, golden_spec = golden_of(inputs, built.outputs, built.spec)
    staging = work / (f"candidate-{profile.name}-{built.spec.name}" if benchmark_only else f"bundle-{profile.name}")
    staging.mkdir()
    golden_path = staging / "golden.npz"
    golden.save(golden_path)
    sources: dict[str, Path] = {"golden.npz": golden_path}
    for rel, path in built.files.items():
        copy = staging.joinpath(*rel.split("/"))  # relative paths kept: an .mlpackage is a directory tree
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        sources[rel] = copy
    model_rel = built.model_rel
    checks = golden_spec.outputs
    search = search_report(found, built.spec.name)
    held, _ = golden_figures(inputs, built, found.budget, search)
    drift = build_reference(
        {k: np.concatenate([inputs.calib.inputs[k], v]) for k, v in evaluation.inputs.items()},
        built.outputs,
        {check.output: check.rule for check in checks},
    )
    (staging / DRIFT_REFERENCE).write_text(drift.model_dump_json(), "utf-8")
    sources[DRIFT_REFERENCE] = staging / DRIFT_REFERENCE
    web_options = None
    if target.runtime == "onnxruntime-web":
        web.write_golden_json(golden, golden_spec, staging / web.GOLDEN_JSON)
        sources[web.GOLDEN_JSON] = staging / web.GOLDEN_JSON
        web_options = WebOptions(
            golden_json=web.GOLDEN_JSON, ort_format=built.spec.ort_format, onnxruntime_web=web.ORT_WEB_VERSION
        )
    artifact_sha = hashlib.sha256(b"".join(sha256_file(p).encode() for _, p in sorted(sources.items()))).hexdigest()
    bundle_id = f"{request.name}-{request.version}-{profile.name}-{artifact_sha[:8]}" + "-bench" * benchmark_only
    stats = found.latencies.get(built.spec.name)
    prepared = built.prepared.model
    initializers = {init.name for init in prepared.graph.initializer}
    custom = cops.custom_ops(prepared)
    manifest = Manifest(
        bundle_id=bundle_id,
        model_name=request.name,
        model_version=request.version,
        profile=profile.name,
        format=target.format,
        model_path=model_rel,
        recipe=Recipe(
            name=built.spec.name,
            precision=cast(Precision, built.spec.precision),
            runtime=target.runtime,
            passes=built.passes,
        ),
        providers=list(target.providers),
        custom_op_domains={op.domain: op.version for op in custom},
        custom_ops=custom,
        opset=opset_of(prepared),
        inputs=[tensor_spec(v) for v in prepared.graph.input if v.name not in initializers],
        outputs=list(inputs.outputs),
        files=describe_files(sources),
        accuracy=accuracy_report(found, built, len(evaluation)),
        latency=latency_report(on_devices, found.choice.chosen, target.runtime)
        if on_devices and found.choice and found.choice.chosen
        else LatencyReport(
            median_ms=stats.median_ms,
            p90_ms=stats.p90_ms,
            runtime=target.runtime,
            provider=target.providers[0],
            threads=found.threads[0] if found.threads else request.threads,
            machine=_machine(),
        )
        if stats and status.measurable
        else None,
        farm=on_devices,
        benchmark_only=benchmark_only,
        golden=golden_spec,
        source_sha256=inputs.source.sha256,
        tensorrt=built.tensorrt,
        web=web_options,
        class_labels=inputs.source.class_labels,
        search=search,
        drift_reference=DRIFT_REFERENCE,
        golden_hold=held,
        resources=None
        if benchmark_only
        else _resources(inputs, found, built, target, status, staging / model_rel, finish_by),
    )
    out_path = request.out / f"{request.name}-{request.version}-{profile.name}.bundle"
    out_path = staging.with_suffix(".bundle") if benchmark_only else out_path  # a candidate is published, not kept
    pack_bundle(out_path, manifest, sources, request.key)
    return out_path, bundle_id


MEMORY_MIN_LEFT_S = 3.0  # the peak-memory probe (a fresh process: imports, load, runs) is not started with less left
PACK_S = 1.0  # kept after the probe for packing and signing the bundle


def _resources(
    inputs: SearchRequest,
    found: ProfileSearch,
    built: Built,
    target: Target,
    status: TargetStatus,
    model: Path,
    finish_by: float | None = None,
) -> ResourceNeeds | None:
    """The bundle's peak memory on the runtime and provider it was timed on (where this host runs it, in the time
    the budget leaves), and the FLOPs of one run (converter/resources.py)."""
    feeds = inputs.evaluation.sample(0)
    graph = model if model.suffix in (".onnx", ".xml") else built.prepared.model
    flops = flops_of(graph, feeds, built.spec.hint) if graph is not None else None
    threads = found.threads[0] if found.threads else inputs.threads
    figures = []
    left = None if finish_by is None else finish_by - time.monotonic() - PACK_S
    unmeasured = "the manifest gives no peak memory: a device counts the files' size"
    if status.measurable and left is not None and left < MEMORY_MIN_LEFT_S:
        deadline.cut("peak memory", f"not measured: {max(left, 0.0):.0f} s were left; {unmeasured}")
    elif status.measurable:
        figure = measure_memory(model, target.runtime, target.providers[0], feeds, threads, timeout_s=left or 600.0)
        if figure.timed_out and left is not None:
            deadline.cut("peak memory", f"stopped at the time budget's end after {left:.0f} s; {unmeasured}")
        elif figure.peak_mb is None:
            log.info("%s: peak memory not measured: %s", target.runtime, figure.reason)
        figures.append(figure)
    return resource_needs(figures, flops)


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}".strip()
