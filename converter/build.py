"""`edgefleet convert`: source model + data → one signed bundle per hardware profile, and a report.

Order of work: check everything the user gave (model, pins, data) before writing anything; run the FP32 source
on the evaluation set for the reference; per profile, search recipes (converter.search) and sign the winner;
write the report. Bundles and report files appear in `out` only when complete (written then renamed); the
work directory inside `out` is removed whatever happens.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import onnxruntime as ort

from edgefleet.converter.accuracy import Budget, plan_metric
from edgefleet.converter.cache import BuildCache
from edgefleet.converter.candidates import Built
from edgefleet.converter.context import Context, Progress
from edgefleet.converter.measure import ort_runner, predict
from edgefleet.converter.model import SourceModel, load_model, tensor_spec
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import web
from edgefleet.converter.passes.custom_ops import Policy
from edgefleet.converter.passes.graph import FixDimsConfig
from edgefleet.converter.prepare import opset_of
from edgefleet.converter.search import ProfileSearch, search
from edgefleet.converter.targets import TargetStatus
from edgefleet.core.bundle import describe_files, pack_bundle, sha256_file
from edgefleet.core.errors import ConversionError, DataError, UserInputError
from edgefleet.core.golden import GoldenSet, argmax_agreement
from edgefleet.core.manifest import (
    AccuracyReport,
    GoldenSpec,
    LatencyReport,
    Manifest,
    Precision,
    Recipe,
    WebOptions,
    parse_version,
)
from edgefleet.core.profiles import HostFacts, Profile, Target
from edgefleet.core.signing import SigningKey
from edgefleet.core.tensors import Dataset, load_dataset

log = logging.getLogger(__name__)

GOLDEN_COUNT = 16
MODEL_PATH = "model/model.onnx"


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
    min_sqnr_db: float | None = None  # overrides every profile's SQNR floor when set
    pins: dict[str, str] = field(default_factory=dict)  # inputs declared constant: name → value (JSON number/list)
    fix_dims: dict[str, int] = field(default_factory=dict)  # symbolic dimension name → value
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # input name → fixed shape
    runtimes: tuple[str, ...] | None = None  # only these runtimes' targets (None = every target)
    cache_dir: Path | None = None  # content-addressed build cache; None = no cache
    report: bool = True  # write <name>-<version>.report.json/.html and plots into out
    custom_ops: Policy = "decompose"  # decompose known custom ops everywhere | host: keep them where loadable | keep
    torch_model: Path | None = None  # CoreML targets: the user's torch model (.pt TorchScript / .pt2 torch.export)


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
    format: str | None = None
    runtime: str | None = None
    provider: str | None = None
    measured: bool = False
    notes: list[str] = field(default_factory=list)
    passes: list[dict[str, object]] = field(default_factory=list)
    worst_layers: dict[str, list[dict[str, object]]] = field(default_factory=dict)


def convert(request: ConvertRequest, progress: Progress = lambda _msg: None) -> list[ProfileResult]:
    """Build, measure and sign. User errors are raised before anything is written to `out`."""
    try:
        parse_version(request.version)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    if request.custom_ops not in cops.POLICIES:
        raise UserInputError(f"unknown custom-op policy {request.custom_ops!r}; valid: {', '.join(cops.POLICIES)}")
    cops.packages()  # a broken custom-op package is a user error, reported before any work
    if request.torch_model is not None and not request.torch_model.is_file():
        raise UserInputError(f"torch model {request.torch_model} not found")
    source = load_model(request.model)
    pins = _parse_pins(source, request.pins)
    inputs = [spec for spec in source.inputs if spec.name not in pins]
    calib = load_dataset(request.calib, inputs, role="calibration")
    evaluation = load_dataset(request.eval, inputs, role="evaluation")
    _check_runs(source, pins, calib, "calibration")
    progress("reference: running the FP32 source model on the evaluation set")
    reference = predict(_with_pins(ort_runner(source.path, request.threads), pins), evaluation)
    plan = plan_metric(reference, evaluation.labels)
    ref_value = _reference_value(reference, evaluation, plan)
    request.out.mkdir(parents=True, exist_ok=True)
    results: list[ProfileResult] = []
    with tempfile.TemporaryDirectory(prefix=".edgefleet-convert-", dir=request.out) as tmp:
        ctx = Context(
            source=source,
            pins=pins,
            user_dims=FixDimsConfig(dims=dict(request.fix_dims), shapes=dict(request.input_shapes)),
            calib=calib,
            evaluation=evaluation,
            reference=reference,
            plan=plan,
            ref_value=ref_value,
            data_sha={"calib": sha256_file(request.calib), "eval": sha256_file(request.eval)}
            | ({"torch": sha256_file(request.torch_model)} if request.torch_model else {}),
            threads=request.threads,
            work=Path(tmp),
            cache=BuildCache(request.cache_dir) if request.cache_dir else None,
            progress=progress,
            custom_op_policy=request.custom_ops,
            torch_model=request.torch_model,
        )
        facts = HostFacts.probe(f for p in request.profiles for f in p.match.files)
        providers = frozenset(ort.get_available_providers())
        for index, profile in enumerate(request.profiles, 1):
            progress(f"[{index}/{len(request.profiles)}] {profile.name}")
            results.append(_convert_profile(request, ctx, profile, facts, providers))
        if request.report:
            from edgefleet.converter.report import write_report

            progress("writing the conversion report")
            write_report(request, source, plan.name, results, ctx.work)
    return results


def _parse_pins(source: SourceModel, pins: dict[str, str]) -> dict[str, np.ndarray]:
    import json

    specs = {spec.name: spec for spec in source.inputs}
    parsed: dict[str, np.ndarray] = {}
    for name, text in pins.items():
        if name not in specs:
            raise UserInputError(f"cannot pin {name!r}: the model's inputs are {sorted(specs)}")
        try:
            value = np.asarray(json.loads(text), dtype=np.dtype(specs[name].dtype))
        except (ValueError, TypeError) as err:
            raise UserInputError(f"pin {name}={text!r}: not a {specs[name].dtype} value ({err})") from err
        if value.ndim != len(specs[name].shape):
            raise UserInputError(f"pin {name}={text!r}: rank {value.ndim}, the model wants shape {specs[name].shape}")
        parsed[name] = value
    return parsed


def _with_pins(runner, pins: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    return runner if not pins else (lambda feeds: runner({**feeds, **pins}))


def _check_runs(source: SourceModel, pins: dict[str, np.ndarray], data: Dataset, role: str) -> None:
    """The first sample must run through the source model: catches shapes that only the graph constrains."""
    runner = _with_pins(ort_runner(source.path), pins)
    try:
        runner(data.sample(0))
    except Exception as err:  # onnxruntime's own errors on bad shapes / dtypes
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise DataError(f"{role} sample 0 does not run through the model: {first}") from err


def _reference_value(reference: dict[str, np.ndarray], evaluation: Dataset, plan) -> float:  # type: ignore[no-untyped-def]
    from edgefleet.converter.accuracy import score

    return score(reference, reference, evaluation.labels, plan).value


def _budget(request: ConvertRequest, profile: Profile) -> Budget:
    return Budget(
        max_drop=request.max_drop if request.max_drop is not None else profile.accuracy_budget.max_drop,
        min_sqnr_db=request.min_sqnr_db if request.min_sqnr_db is not None else profile.accuracy_budget.min_sqnr_db,
    )


def _convert_profile(
    request: ConvertRequest, ctx: Context, profile: Profile, facts: HostFacts, providers: frozenset[str]
) -> ProfileResult:
    budget = _budget(request, profile)
    if request.runtimes is not None:
        kept = [t for t in profile.targets if t.runtime in request.runtimes]
        skipped = [t.runtime for t in profile.targets if t.runtime not in request.runtimes]
        if not kept:
            return _failed(ctx, profile, f"no target with runtimes {list(request.runtimes)} (profile has {skipped})")
        profile = profile.model_copy(update={"targets": kept})
    try:
        found = search(ctx, profile, budget, facts, providers)
    except ConversionError as err:
        return _failed(ctx, profile, str(err))
    assert found.choice is not None
    chosen = found.choice.chosen
    report = [_candidate_dict(c) for c in ([chosen] if chosen else []) + found.choice.rejected]
    winner = found.winner()
    if chosen is None or winner is None:
        reasons = (
            "; ".join(found.notes) if not found.candidates else "no candidate met the accuracy budget and size limit"
        )
        result = _failed(ctx, profile, reasons)
        result.candidates, result.notes, result.worst_layers = report, found.notes, found.layer_reports
        return result
    built, target, status = winner
    ctx.progress(f"{profile.name}: signing bundle ({chosen.name})")
    result = ProfileResult(
        profile.name, None, None, chosen.name, chosen.accuracy, ctx.ref_value, ctx.plan.name, chosen.latency_ms,
        chosen.size_bytes, report, format=target.format, runtime=target.runtime, provider=chosen.provider,
        measured=status.measurable, notes=found.notes, passes=[p.model_dump() for p in built.passes],
        worst_layers=found.layer_reports,
    )  # fmt: skip
    bundle_path, bundle_id = _write_bundle(request, ctx, profile, target, status, built, found, budget)
    result.bundle, result.bundle_id = str(bundle_path), bundle_id
    return result


def _failed(ctx: Context, profile: Profile, error: str) -> ProfileResult:
    return ProfileResult(profile.name, None, None, None, None, ctx.ref_value, ctx.plan.name, None, None, error=error)


def _candidate_dict(candidate: object) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(candidate)  # type: ignore[call-overload]


def _write_bundle(
    request: ConvertRequest,
    ctx: Context,
    profile: Profile,
    target: Target,
    status: TargetStatus,
    built: Built,
    found: ProfileSearch,
    budget: Budget,
) -> tuple[Path, str]:
    assert built.outputs is not None and built.score is not None and built.prepared.model is not None
    evaluation, reference = ctx.evaluation, ctx.reference
    count = min(GOLDEN_COUNT, len(evaluation))
    golden = GoldenSet(
        inputs=evaluation.head(count),
        reference={k: v[:count] for k, v in reference.items()},
        expected={k: v[:count] for k, v in built.outputs.items()},
    )
    staging = ctx.work / f"bundle-{profile.name}"
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
    first = next(iter(reference))
    host_agreement = argmax_agreement(golden.expected[first], golden.reference[first])
    floats = [np.abs(v) for v in golden.expected.values() if np.issubdtype(v.dtype, np.floating)]
    scale = max([1.0] + [float(np.max(v)) for v in floats if v.size])
    # Other CPUs pick other kernels: FP32 differs in the last bits, INT8/FP16 can move by a quantization step.
    # TensorRT engines and CoreML run their own kernels (TF32/FP16 tactics) against this host's proxy outputs.
    exact = built.spec.precision == "fp32" and target.format not in ("onnx-tensorrt", "coreml")
    tolerance = (1e-3 if exact else 5e-2) * scale
    golden_spec = GoldenSpec(count=count, max_abs_error=tolerance, min_agreement=max(0.0, host_agreement - 1.0 / count))
    web_options = None
    if target.runtime == "onnxruntime-web":
        web.write_golden_json(golden, golden_spec, staging / web.GOLDEN_JSON)
        sources[web.GOLDEN_JSON] = staging / web.GOLDEN_JSON
        web_options = WebOptions(
            golden_json=web.GOLDEN_JSON, ort_format=built.spec.ort_format, onnxruntime_web=web.ORT_WEB_VERSION
        )
    artifact_sha = hashlib.sha256(b"".join(sha256_file(p).encode() for _, p in sorted(sources.items()))).hexdigest()
    bundle_id = f"{request.name}-{request.version}-{profile.name}-{artifact_sha[:8]}"
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
        outputs=ctx.source.outputs,
        files=describe_files(sources),
        accuracy=AccuracyReport(
            metric=ctx.plan.name,
            value=built.score.value,
            reference=ctx.ref_value,
            budget=budget.allowed_drop(ctx.plan.name, ctx.ref_value),
            samples=len(evaluation),
            passed=True,
        ),
        latency=LatencyReport(
            median_ms=stats.median_ms,
            p90_ms=stats.p90_ms,
            runtime=target.runtime,
            provider=target.providers[0],
            threads=request.threads,
            machine=_machine(),
        )
        if stats and status.measurable
        else None,
        golden=golden_spec,
        source_sha256=ctx.source.sha256,
        tensorrt=built.tensorrt,
        web=web_options,
    )
    out_path = request.out / f"{request.name}-{request.version}-{profile.name}.bundle"
    pack_bundle(out_path, manifest, sources, request.key)
    return out_path, bundle_id


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}".strip()
