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
import time
from pathlib import Path
from typing import cast

import numpy as np
import onnxruntime as ort

from edgefleet.converter import farm_choice
from edgefleet.converter.accuracy import Budget, plan_metric
from edgefleet.converter.cache import BuildCache
from edgefleet.converter.candidates import Built
from edgefleet.converter.context import Context, Progress
from edgefleet.converter.farm_choice import Farm
from edgefleet.converter.measure import ort_runner, predict
from edgefleet.converter.model import SourceModel, load_model, tensor_spec
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import web
from edgefleet.converter.passes.graph import FixDimsConfig
from edgefleet.converter.precision_holdout import accuracy_report, with_judgements
from edgefleet.converter.prepare import opset_of
from edgefleet.converter.request import ConvertRequest, ProfileResult
from edgefleet.converter.search import ProfileSearch, search, search_report
from edgefleet.converter.targets import TargetStatus
from edgefleet.core.bundle import describe_files, pack_bundle, sha256_file
from edgefleet.core.drift_stats import build_reference
from edgefleet.core.errors import ConversionError, DataError, UserInputError
from edgefleet.core.golden import GoldenSet, argmax_agreement
from edgefleet.core.manifest import (
    FarmReport,
    GoldenSpec,
    LatencyReport,
    Manifest,
    Precision,
    Recipe,
    WebOptions,
    parse_version,
)
from edgefleet.core.output_rules import derive_checks
from edgefleet.core.profiles import HostFacts, Profile, Target
from edgefleet.core.tensors import Dataset, load_dataset

log = logging.getLogger(__name__)

GOLDEN_COUNT = 64  # at least this many golden samples when the evaluation set has them
DRIFT_REFERENCE = "drift_reference.json"
MODEL_PATH = "model/model.onnx"


def convert(
    request: ConvertRequest, progress: Progress = lambda _msg: None, farm: Farm | None = None
) -> list[ProfileResult]:
    """Build, measure and sign. User errors are raised before anything is written to `out`. With a `farm`, each
    profile's gated candidates are measured on its devices and chosen by their figures (converter/farm_choice.py)."""
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
    reference = predict(_with_pins(ort_runner(source.runnable, request.threads), pins), evaluation)
    plan = plan_metric(reference, evaluation.labels, request.metric)
    ref_value = _reference_value(reference, evaluation, plan)
    if plan.note:
        progress(f"metric {plan.name}: {plan.note}")
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
            deadline=time.monotonic() + request.time_budget_s if request.time_budget_s else None,
        )
        facts = HostFacts.probe(f for p in request.profiles for f in p.match.files)
        providers = frozenset(ort.get_available_providers())
        for index, profile in enumerate(request.profiles, 1):
            progress(f"[{index}/{len(request.profiles)}] {profile.name}")
            results.append(_convert_profile(request, ctx, profile, facts, providers, farm))
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
    runner = _with_pins(ort_runner(source.runnable), pins)
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
        min_score=request.min_score,
    )


def _convert_profile(
    request: ConvertRequest,
    ctx: Context,
    profile: Profile,
    facts: HostFacts,
    providers: frozenset[str],
    farm: Farm | None = None,
) -> ProfileResult:
    budget = _budget(request, profile)
    if request.runtimes is not None:
        kept = [t for t in profile.targets if t.runtime in request.runtimes]
        skipped = [t.runtime for t in profile.targets if t.runtime not in request.runtimes]
        if not kept:
            return _failed(ctx, profile, f"no target with runtimes {list(request.runtimes)} (profile has {skipped})")
        profile = profile.model_copy(update={"targets": kept})
    try:
        found = search(ctx, profile, budget, facts, providers, prune=farm is None and request.prune)
    except ConversionError as err:
        return _failed(ctx, profile, str(err))
    assert found.choice is not None
    on_devices = None
    if farm is not None:
        on_devices = farm_choice.choose_on_devices(ctx, found, budget, farm, lambda b, t, s: _write_bundle(
            request, ctx, profile, t, s, b, found, budget, benchmark_only=True))  # fmt: skip
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
        measured=status.measurable or on_devices is not None, notes=found.notes,
        passes=[p.model_dump() for p in built.passes], worst_layers=found.layer_reports,
        farm=on_devices.model_dump(mode="json") if on_devices else None,
        head_to_head=found.head_to_head.as_dict() if found.head_to_head and on_devices is None else None,
    )  # fmt: skip
    bundle_path, bundle_id = _write_bundle(request, ctx, profile, target, status, built, found, budget, on_devices)
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
    on_devices: FarmReport | None = None,
    benchmark_only: bool = False,
) -> tuple[Path, str]:
    """Sign `built` as the profile's bundle, or as a benchmark-only candidate for the devices to measure."""
    assert built.outputs is not None and built.score is not None and built.prepared.model is not None
    evaluation, reference = ctx.evaluation, ctx.reference
    count = min(GOLDEN_COUNT, len(evaluation))
    golden = GoldenSet(
        inputs=evaluation.head(count),
        reference={k: _plain(v[:count]) for k, v in reference.items()},
        expected={k: _plain(v[:count]) for k, v in built.outputs.items()},
    )
    staging = ctx.work / (f"candidate-{profile.name}-{built.spec.name}" if benchmark_only else f"bundle-{profile.name}")
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
    checks = derive_checks(golden.reference, golden.expected, tolerance)  # rule + tolerances per output kind
    golden_spec = GoldenSpec(
        count=count, max_abs_error=tolerance, min_agreement=max(0.0, host_agreement - 1.0 / count), outputs=checks
    )
    drift = build_reference(
        {k: np.concatenate([ctx.calib.inputs[k], v]) for k, v in evaluation.inputs.items()},
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
        outputs=ctx.source.outputs,
        files=describe_files(sources),
        accuracy=accuracy_report(ctx, built, budget, len(evaluation)),
        latency=farm_choice.latency_report(on_devices, found.choice.chosen, target.runtime)
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
        source_sha256=ctx.source.sha256,
        tensorrt=built.tensorrt,
        web=web_options,
        class_labels=ctx.source.class_labels,
        search=with_judgements(search_report(ctx, found, budget, built.spec.name), (b for b, *_ in found.built)),
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
