"""Signing a chosen candidate as a bundle: its artifacts, the golden set and its per-output checks (the device's
golden check, edgefleet.core.quality), the drift reference, and the manifest (recipe, passes, accuracy, latency,
the search that chose it). Files appear in `out` only when complete (packed, then renamed)."""

from __future__ import annotations

import hashlib
import platform
import shutil
from pathlib import Path
from typing import cast

import numpy as np

from edgefleet.converter.onnx_graph import opset_of, tensor_spec
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import web
from edgefleet.converter.request import ConvertRequest
from edgefleet.converter.search import (
    Built,
    ProfileSearch,
    SearchRequest,
    TargetStatus,
    accuracy_report,
    latency_report,
    search_report,
)
from edgefleet.core.bundle.archive import describe_files, pack_bundle, sha256_file
from edgefleet.core.bundle.manifest import (
    FarmReport,
    GoldenSpec,
    LatencyReport,
    Manifest,
    Precision,
    Recipe,
    WebOptions,
)
from edgefleet.core.profiles import Target
from edgefleet.core.quality.drift_stats import build_reference
from edgefleet.core.quality.golden import GoldenSet, argmax_agreement
from edgefleet.core.quality.output_rules import derive_checks

GOLDEN_COUNT = 64  # at least this many golden samples when the evaluation set has them
DRIFT_REFERENCE = "drift_reference.json"


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
) -> tuple[Path, str]:
    """Sign `built` as the profile's bundle, or as a benchmark-only candidate for the devices to measure; returns
    the bundle's path and id."""
    assert built.outputs is not None and built.score is not None and built.prepared.model is not None
    profile = found.profile
    evaluation, reference = inputs.evaluation, inputs.reference
    count = min(GOLDEN_COUNT, len(evaluation))
    order = [inputs.plan.output] + [k for k in reference if k != inputs.plan.output]  # the device judges the first
    golden = GoldenSet(
        inputs=evaluation.head(count),
        reference={k: _plain(reference[k][:count]) for k in order},
        expected={k: _plain(built.outputs[k][:count]) for k in order},
    )
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
    first = order[0]
    host_agreement = argmax_agreement(golden.expected[first], golden.reference[first])
    floats = [np.abs(v) for v in golden.expected.values() if np.issubdtype(v.dtype, np.floating)]
    scale = max([1.0] + [float(np.max(v)) for v in floats if v.size])
    # Other CPUs pick other kernels: FP32 differs in the last bits, INT8/FP16 can move by a quantization step.
    # TensorRT engines and CoreML run their own kernels (TF32/FP16 tactics) against this host's proxy outputs.
    exact = built.spec.precision == "fp32" and target.format not in ("onnx-tensorrt", "coreml")
    tolerance = (1e-3 if exact else 5e-2) * scale
    judged = [k for k in order if k not in inputs.plan.skipped]  # an input passed through is never judged
    checks = derive_checks({k: golden.reference[k] for k in judged}, golden.expected, tolerance)
    golden_spec = GoldenSpec(
        count=count, max_abs_error=tolerance, min_agreement=max(0.0, host_agreement - 1.0 / count), outputs=checks
    )
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
        search=search_report(found, built.spec.name),
        drift_reference=DRIFT_REFERENCE,
    )
    out_path = request.out / f"{request.name}-{request.version}-{profile.name}.bundle"
    out_path = staging.with_suffix(".bundle") if benchmark_only else out_path  # a candidate is published, not kept
    pack_bundle(out_path, manifest, sources, request.key)
    return out_path, bundle_id


def _plain(values: np.ndarray) -> np.ndarray:
    """String outputs (class names) come from onnxruntime as object arrays, which only pickle: store unicode."""
    return values.astype(str) if values.dtype == object else values


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}".strip()
