"""`edgefleet convert`: source model + data → one signed bundle per hardware profile, and a report."""

from __future__ import annotations

import logging
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from edgefleet.converter.measure import Runner, interleaved_latency, ort_runner, predict, score
from edgefleet.converter.model import SourceModel, load_model
from edgefleet.converter.passes import optimize_portable
from edgefleet.converter.quantize import quantize_int8_static
from edgefleet.converter.recipes import Candidate, choose
from edgefleet.core.bundle import describe_files, pack_bundle, sha256_file
from edgefleet.core.errors import ConversionError, UserInputError
from edgefleet.core.golden import GoldenSet, argmax_agreement
from edgefleet.core.manifest import (
    AccuracyReport,
    GoldenSpec,
    LatencyReport,
    Manifest,
    Metric,
    PassRecord,
    Precision,
    Recipe,
    parse_version,
)
from edgefleet.core.profiles import Profile, Target
from edgefleet.core.signing import SigningKey
from edgefleet.core.tensors import Dataset, load_dataset

log = logging.getLogger(__name__)

GOLDEN_COUNT = 16
MODEL_PATH = "model/model.onnx"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ConvertRequest:
    model: Path
    profiles: list[Profile]
    calib: Path
    eval: Path
    out: Path
    key: SigningKey
    name: str
    version: str
    max_drop: float | None = None  # overrides every profile's budget when set
    threads: int = 1


@dataclass
class ProfileResult:
    profile: str
    bundle: str | None
    bundle_id: str | None
    recipe: str | None
    accuracy: float | None
    reference_accuracy: float
    metric: str
    latency_ms: float | None
    size_bytes: int | None
    candidates: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None


@dataclass
class _Built:
    candidate: Candidate
    path: Path | None
    passes: list[PassRecord]
    runner: Runner | None = None
    outputs: dict[str, np.ndarray] | None = None


def convert(request: ConvertRequest, progress: Progress = lambda _msg: None) -> list[ProfileResult]:
    """Build, measure and sign. Bundles appear in `out` only when complete (written then renamed)."""
    parse_version(request.version)
    source = load_model(request.model)
    calib = load_dataset(request.calib, source.inputs, role="calibration")
    evaluation = load_dataset(request.eval, source.inputs, role="evaluation")
    request.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".edgefleet-convert-", dir=request.out) as tmp:
        work = Path(tmp)
        progress("reference: running the FP32 source model on the evaluation set")
        reference = predict(ort_runner(source.path, request.threads), evaluation)
        ref_score = score(reference, reference, evaluation.labels)
        built: dict[tuple[str, bool], _Built] = {}
        results = []
        for profile in request.profiles:
            results.append(
                _convert_profile(
                    request, profile, source, calib, evaluation, reference, ref_score.value, built, work, progress
                )
            )
    return results


def _convert_profile(
    request: ConvertRequest,
    profile: Profile,
    source: SourceModel,
    calib: Dataset,
    evaluation: Dataset,
    reference: dict[str, np.ndarray],
    ref_value: float,
    built: dict[tuple[str, bool], _Built],
    work: Path,
    progress: Progress,
) -> ProfileResult:
    metric = "top1" if evaluation.labels is not None else "argmax-agreement"
    target = _onnxruntime_target(profile)
    if target is None:
        runtimes = sorted({t.runtime for t in profile.targets})
        return ProfileResult(
            profile.name,
            None,
            None,
            None,
            None,
            ref_value,
            metric,
            None,
            None,
            error=f"no converter for runtimes {runtimes} yet (only onnxruntime)",
        )
    opset = source.opset.get("", 0)
    if not profile.opset.min <= opset <= profile.opset.max:
        return ProfileResult(
            profile.name,
            None,
            None,
            None,
            None,
            ref_value,
            metric,
            None,
            None,
            error=f"opset {opset} outside the profile's range {profile.opset.min}-{profile.opset.max}",
        )
    candidates: list[_Built] = []
    for precision in target.precisions:
        key = (precision, target.int8_reduce_range and precision == "int8-static")
        if key not in built:
            progress(f"{profile.name}: building {precision}")
            built[key] = _build_candidate(precision, key[1], source, calib, evaluation, reference, work, request)
        candidates.append(built[key])
    measurable: dict[str, Runner] = {b.candidate.name: b.runner for b in candidates if b.runner is not None}
    progress(f"{profile.name}: timing {', '.join(measurable)} (interleaved rounds)")
    latencies = interleaved_latency(measurable, evaluation) if measurable else {}
    measured = [
        Candidate(**{**asdict(b.candidate), "latency_ms": latencies[b.candidate.name].median_ms})
        if b.candidate.name in latencies
        else b.candidate
        for b in candidates
    ]
    max_drop = request.max_drop if request.max_drop is not None else profile.accuracy_budget.max_drop
    choice = choose(measured, reference=ref_value, max_drop=max_drop, size_limit_bytes=int(profile.size_limit_mb * 1e6))
    report = [asdict(c) for c in ([choice.chosen] if choice.chosen else []) + choice.rejected]
    if choice.chosen is None:
        return ProfileResult(
            profile.name,
            None,
            None,
            None,
            None,
            ref_value,
            metric,
            None,
            None,
            report,
            error="no candidate met the accuracy budget and size limit",
        )
    winner = next(b for b in candidates if b.candidate.name == choice.chosen.name)
    stats = latencies[winner.candidate.name]
    progress(f"{profile.name}: signing bundle ({choice.chosen.name})")
    bundle_path, bundle_id = _write_bundle(
        request,
        profile,
        target,
        source,
        evaluation,
        reference,
        winner,
        metric,
        ref_value,
        max_drop,
        LatencyReport(
            median_ms=stats.median_ms,
            p90_ms=stats.p90_ms,
            runtime="onnxruntime",
            provider="CPUExecutionProvider",
            threads=request.threads,
            machine=_machine(),
        ),
        work,
    )
    return ProfileResult(
        profile.name,
        str(bundle_path),
        bundle_id,
        choice.chosen.name,
        choice.chosen.accuracy,
        ref_value,
        metric,
        stats.median_ms,
        choice.chosen.size_bytes,
        report,
    )


def _onnxruntime_target(profile: Profile) -> Target | None:
    return next((t for t in profile.targets if t.runtime == "onnxruntime" and t.format == "onnx"), None)


def _build_candidate(
    precision: str,
    reduce_range: bool,
    source: SourceModel,
    calib: Dataset,
    evaluation: Dataset,
    reference: dict[str, np.ndarray],
    work: Path,
    request: ConvertRequest,
) -> _Built:
    name = "fp32" if precision == "fp32" else f"{precision}-qdq" + ("-reduce-range" if reduce_range else "")
    stub = Candidate(name=name, precision=precision, runtime="onnxruntime")
    fp32_path = work / "fp32.onnx"
    passes = [PassRecord(name="ort-basic-optimization", params={"level": "basic", "portable": True})]
    try:
        if not fp32_path.exists():
            optimize_portable(source.path, fp32_path)
        if precision == "fp32":
            path = fp32_path
        elif precision == "int8-static":
            path = quantize_int8_static(fp32_path, work / f"{name}.onnx", calib, reduce_range=reduce_range)
            passes.append(
                PassRecord(
                    name="int8-static-qdq",
                    params={
                        "activations": "uint8",
                        "weights": "int8",
                        "per_channel": True,
                        "calibration": "minmax",
                        "reduce_range": reduce_range,
                        "calibration_samples": len(calib),
                    },
                )
            )
        else:
            return _Built(Candidate(**{**asdict(stub), "error": f"{precision} is not implemented yet"}), None, [])
        runner = ort_runner(path, request.threads)
        outputs = predict(runner, evaluation)
    except (ConversionError, UserInputError) as err:
        log.info("candidate %s failed: %s", name, err)
        return _Built(Candidate(**{**asdict(stub), "error": str(err)}), None, passes)
    accuracy = score(outputs, reference, evaluation.labels).value
    candidate = Candidate(
        name=name, precision=precision, runtime="onnxruntime", size_bytes=path.stat().st_size, accuracy=accuracy
    )
    return _Built(candidate, path, passes, runner, outputs)


def _write_bundle(
    request: ConvertRequest,
    profile: Profile,
    target: Target,
    source: SourceModel,
    evaluation: Dataset,
    reference: dict[str, np.ndarray],
    winner: _Built,
    metric: str,
    ref_value: float,
    max_drop: float,
    latency: LatencyReport,
    work: Path,
) -> tuple[Path, str]:
    assert winner.path is not None and winner.outputs is not None  # only measured candidates can win
    count = min(GOLDEN_COUNT, len(evaluation))
    golden = GoldenSet(
        inputs=evaluation.head(count),
        reference={k: v[:count] for k, v in reference.items()},
        expected={k: v[:count] for k, v in winner.outputs.items()},
    )
    staging = work / f"bundle-{profile.name}"
    staging.mkdir()
    golden_path = staging / "golden.npz"
    golden.save(golden_path)
    model_path = staging / "model.onnx"
    shutil.copyfile(winner.path, model_path)
    first = next(iter(reference))
    host_agreement = argmax_agreement(golden.expected[first], golden.reference[first])
    scale = max(1.0, max(float(np.max(np.abs(v))) for v in golden.expected.values()))
    # Other CPUs pick other kernels: FP32 differs in the last bits, INT8 can move by a quantization step.
    tolerance = (1e-3 if winner.candidate.precision == "fp32" else 5e-2) * scale
    artifact_sha = sha256_file(model_path)
    bundle_id = f"{request.name}-{request.version}-{profile.name}-{artifact_sha[:8]}"
    sources = {MODEL_PATH: model_path, "golden.npz": golden_path}
    assert winner.candidate.accuracy is not None
    manifest = Manifest(
        bundle_id=bundle_id,
        model_name=request.name,
        model_version=request.version,
        profile=profile.name,
        format="onnx",
        model_path=MODEL_PATH,
        recipe=Recipe(
            name=winner.candidate.name,
            precision=cast(Precision, winner.candidate.precision),
            runtime="onnxruntime",
            passes=winner.passes,
        ),
        providers=list(target.providers),
        custom_op_domains=source.custom_domains,
        opset=source.opset,
        inputs=source.inputs,
        outputs=source.outputs,
        files=describe_files(sources),
        accuracy=AccuracyReport(
            metric=cast(Metric, metric),
            value=winner.candidate.accuracy,
            reference=ref_value,
            budget=max_drop,
            samples=len(evaluation),
            passed=True,
        ),
        latency=latency,
        golden=GoldenSpec(count=count, max_abs_error=tolerance, min_agreement=max(0.0, host_agreement - 1.0 / count)),
        source_sha256=source.sha256,
    )
    out_path = request.out / f"{request.name}-{request.version}-{profile.name}.bundle"
    pack_bundle(out_path, manifest, sources, request.key)
    return out_path, bundle_id


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}".strip()
