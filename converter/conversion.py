"""`edgefleet convert`: source model + data → one signed bundle per hardware profile, and a report.

Order of work: check everything the user gave (model, pins, data) before writing anything; run the FP32 source
on the evaluation set for the reference; load all of it once into the search's frozen request; per profile,
search recipes (converter.search) and sign the winner (converter.bundle); write the report (converter.report).
Bundles and report files appear in `out` only when complete (written then renamed); the work directory inside
`out` is removed whatever happens.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgefleet.converter import deadline, phases
from edgefleet.converter.bundle import write_bundle
from edgefleet.converter.generative.source import is_generative
from edgefleet.converter.model import SourceModel, load_model
from edgefleet.converter.onnx_graph import graph_inputs, image_layout, passthrough_outputs
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.passes import graph
from edgefleet.converter.passes.graph import FixDimsConfig
from edgefleet.converter.report import write_report
from edgefleet.converter.request import ConvertRequest, ProfileResult
from edgefleet.converter.roofline import Artifact, judge, machine_limits, remember
from edgefleet.converter.runners import Runner, ort_runner, predict
from edgefleet.converter.search import (
    Budget,
    BuildCache,
    Farm,
    MetricPlan,
    ProfileSearch,
    Progress,
    SearchRequest,
    Workspace,
    choose_on_devices,
    plan_metric,
    search,
)
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest, sha256_file
from edgefleet.core.bundle.manifest import TensorSpec, parse_version
from edgefleet.core.errors import ConversionError, DataError, UserInputError
from edgefleet.core.profiles import HostFacts, Profile
from edgefleet.core.tensors import Dataset, load_dataset

log = logging.getLogger(__name__)
__all__ = ["convert"]

REFERENCE_SHARE = 0.15  # under --time-budget, of the budget for the FP32 reference on the evaluation set
MIN_EVAL_SAMPLES = 2  # ... which keeps at least this many samples, however slow the machine
ROOFLINE_MIN_LEFT_S = 5.0  # under --time-budget, the rooflines (and this machine's limits) need this much left
LIMITS_MIN_LEFT_S = 30.0  # ... and measuring this machine's limits for them, when no cache holds them
PLOT_MIN_LEFT_S = 5.0  # ... and the report's latency-vs-accuracy plots (matplotlib's import alone takes seconds)
GENERATIVE_OPTIONS = ("max_perplexity_ratio", "min_next_token_agreement", "prompt_tokens", "output_tokens")


def convert(
    request: ConvertRequest, progress: Progress = lambda _msg: None, farm: Farm | None = None
) -> list[ProfileResult]:
    """Build, measure and sign. User errors are raised before anything is written to `out`. With a `farm`, each
    profile's gated candidates are measured on its devices and chosen by their figures (converter.search). A
    language model (a model directory, or an ONNX with past key/value inputs) goes to converter.generative."""
    if is_generative(request.model):
        if farm is not None:
            raise UserInputError("--measure-on is for ONNX models; a language model is timed on this host only")
        from edgefleet.converter.generative.conversion import convert_generative

        return convert_generative(request, progress)
    started = time.monotonic()  # --time-budget counts from here: loading, the reference and every profile's search
    generative = [f"--{k.replace('_', '-')}" for k in GENERATIVE_OPTIONS if getattr(request, k) is not None]
    if generative:
        raise UserInputError(f"{', '.join(generative)}: for language models (a model directory), not an ONNX model")
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
    user_dims = FixDimsConfig(dims=dict(request.fix_dims), shapes=dict(request.input_shapes))
    runnable, specs = source.runnable, source.inputs
    if (user_dims.dims or user_dims.shapes) and not source.large:  # the user's shapes replace what was declared
        runnable = graph.fix_dims(source.proto, user_dims)
        specs = graph_inputs(runnable)
    inputs = [spec for spec in specs if spec.name not in pins]
    calib = _load(request.calib, inputs, "calibration")
    evaluation = _load(request.eval, inputs, "evaluation")
    _check_runs(runnable, pins, calib, "calibration", request.calib, inputs)
    progress("reference: running the FP32 source model on the evaluation set")
    with deadline.recording_cuts() as cut:
        reference, evaluation = sized_reference(
            _with_pins(ort_runner(runnable, request.threads), pins), evaluation, request.time_budget_s
        )
    outputs, warnings = checked_outputs(source.outputs, reference)
    for warning in warnings:
        progress(f"warning: {warning}")
    for spec in inputs:
        layout = image_layout(spec.shape) or image_layout(list(evaluation.inputs[spec.name].shape[1:]))
        if layout == "NHWC":
            progress(f"input {spec.name!r} is an NHWC image (channels last): the data is fed as it is, [N, H, W, C]")
    passthrough = passthrough_outputs(source.proto)
    plan = plan_metric(
        reference, evaluation.labels, request.metric, skip=passthrough, class_labels=source.class_labels,
        sqnr=request.min_sqnr_db is not None,
    )  # fmt: skip
    if plan.note:
        progress(f"metric {plan.name}: {plan.note}")
    if plan.skipped:
        progress(f"outputs {', '.join(plan.skipped)} pass an input through: kept in the bundle, never judged")
    loaded = SearchRequest.of(
        source,
        calib=calib,
        evaluation=evaluation,
        reference=reference,
        plan=plan,
        # A cut evaluation set (sized_reference) is other data for the build cache: its outputs are fewer samples.
        data_sha={
            "calib": sha256_file(request.calib),
            "eval": sha256_file(request.eval) + (f"[:{len(evaluation)}]" if cut else ""),
        }
        | ({"torch": sha256_file(request.torch_model)} if request.torch_model else {}),
        pins=pins,
        user_dims=user_dims,
        torch_model=request.torch_model,
        outputs=outputs,
        warnings=warnings,
        threads=request.threads,
        custom_op_policy=request.custom_ops,
    )
    request.out.mkdir(parents=True, exist_ok=True)
    results: list[ProfileResult] = []
    with tempfile.TemporaryDirectory(prefix=".edgefleet-convert-", dir=request.out) as tmp:
        ws = Workspace(
            work=Path(tmp),
            cache=BuildCache(request.cache_dir) if request.cache_dir else None,
            budget_s=request.time_budget_s,
            progress=progress,
            lean=bool(cut),
        )
        if request.time_budget_s:  # the timing rounds and the bundle: 10 s, or a fifth of a larger budget
            ws.reserve_s = max(ws.reserve_s, 0.2 * request.time_budget_s)
        facts = HostFacts.probe(f for p in request.profiles for f in p.match.files)
        providers = frozenset(ort.get_available_providers())
        for index, profile in enumerate(request.profiles, 1):
            progress(f"[{index}/{len(request.profiles)}] {profile.name}")
            if request.time_budget_s:  # the budget counts from the start; each profile gets its share of what is left
                left = started + request.time_budget_s - time.monotonic()
                ws.deadline = time.monotonic() + left / (len(request.profiles) - index + 1)
            with deadline.recording_cuts() as cuts:
                result = _convert_profile(request, loaded, ws, profile, facts, providers, farm)
            if request.time_budget_s:
                result.time_budget = {
                    "budget_s": request.time_budget_s,
                    "seconds": round(time.monotonic() - started, 1),
                    "cut": [asdict(c) for c in cut + cuts],
                }
            results.append(result)
        if request.report:
            progress("writing the conversion report")
            remaining = None if not request.time_budget_s else started + request.time_budget_s - time.monotonic()
            plot = remaining is None or remaining >= PLOT_MIN_LEFT_S
            for done in results if not plot else []:
                listed = done.time_budget["cut"] if done.time_budget else []
                assert isinstance(listed, list)
                listed.append(
                    asdict(deadline.Cut("report plot", f"not drawn: {max(remaining or 0.0, 0.0):.0f} s were left"))
                )
            write_report(request, source, plan.name, results, ws.work, plot=plot)
    return results


def sized_reference(
    runner: Runner, evaluation: Dataset, budget_s: float | None
) -> tuple[dict[str, np.ndarray], Dataset]:
    """The FP32 reference: the source model's outputs on the evaluation set, and the set they are for. Under a time
    budget, only as many samples as fit REFERENCE_SHARE of it (at least MIN_EVAL_SAMPLES): every candidate is
    evaluated on the same samples, so on a slow or busy machine each evaluation costs about as much as this one,
    and the budget holds. The cut is recorded (converter.deadline)."""
    if not budget_s:
        return predict(runner, evaluation), evaluation
    started, outputs = time.monotonic(), []
    for index in range(len(evaluation)):
        took = time.monotonic() - started
        if index >= MIN_EVAL_SAMPLES and took + took / index > REFERENCE_SHARE * budget_s:
            break  # the next sample would overrun the share
        one = Dataset({k: v[index : index + 1] for k, v in evaluation.inputs.items()}, None)
        outputs.append(predict(runner, one))
    count = len(outputs)
    if count < len(evaluation):
        took = time.monotonic() - started
        deadline.cut(
            "evaluation set",
            f"{count} of {len(evaluation)} samples: the FP32 reference took {took / count:.2f} s a sample, and "
            f"{REFERENCE_SHARE:.0%} of the {budget_s:g} s budget is kept for it (every candidate is judged and "
            "the golden set drawn on these samples)",
        )
    reference = {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}
    return reference, evaluation.head(count)


def _parse_pins(source: SourceModel, pins: dict[str, str]) -> dict[str, np.ndarray]:
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


def _with_pins(runner: Runner, pins: dict[str, np.ndarray]) -> Runner:
    return runner if not pins else (lambda feeds: runner({**feeds, **pins}))


def _check_runs(
    runnable: Path | onnx.ModelProto,
    pins: dict[str, np.ndarray],
    data: Dataset,
    role: str,
    path: Path,
    specs: list[TensorSpec],
) -> None:
    """The first sample must run through the source model: catches shapes that only the graph constrains."""
    runner = _with_pins(ort_runner(runnable), pins)
    try:
        runner(data.sample(0))
    except Exception as err:  # onnxruntime's own errors on bad shapes / dtypes
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise DataError(f"{role} sample 0 does not run through the model: {first}{_shape_hint(specs, path)}") from err


def _load(path: Path, specs: list[TensorSpec], role: str) -> Dataset:
    try:
        return load_dataset(path, specs, role=role)
    except DataError as err:
        hint = _shape_hint(specs, path)
        if not hint:
            raise
        raise DataError(f"{err}{hint}") from err


def _shape_hint(specs: list[TensorSpec], path: Path) -> str:
    """Where the data's per-sample shape differs from a fixed shape the model declares (a placeholder such as
    [1, 3, 1, 1] or [1, 3, 224, 224] from an export): how to give the real one."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            return ""  # one .npy array: load_dataset's error says what to do
        with loaded as archive:
            shapes = {k: list(archive[k].shape[1:]) for k in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return ""
    hints = []
    for spec in specs:
        got = shapes.get(spec.name)
        if got is None or (len(got) == len(spec.shape) and all(
            not isinstance(w, int) or w < 0 or w == g for w, g in zip(spec.shape, got, strict=True)
        )):  # fmt: skip
            continue
        layout = image_layout(got)
        where = f" ({layout} image)" if layout else ""
        hints.append(f"--input-shape {spec.name}={','.join(str(d) for d in got)}{where}")
    if not hints:
        return ""
    return f"; if the model's declared shape is a placeholder, give the data's real one: {' '.join(hints)}"


def checked_outputs(declared: list[TensorSpec], reference: dict[str, np.ndarray]) -> tuple[list[TensorSpec], list[str]]:
    """The outputs' signature as a real run returns them (the FP32 reference, stacked per sample): a declared
    fixed dimension, rank or dtype that disagrees is corrected, with a warning each; symbolic dimensions stay."""
    fixed: list[TensorSpec] = []
    warnings: list[str] = []
    for spec in declared:
        value = reference.get(spec.name)
        if value is None:
            fixed.append(spec)
            continue
        actual = list(value.shape[1:])
        dtype = str(value.dtype) if value.dtype.kind not in "OU" else spec.dtype
        if len(actual) != len(spec.shape):
            shape: list[int | str | None] = list(actual)
        else:
            shape = [
                a if isinstance(d, int) and d >= 0 and d != a else d for d, a in zip(spec.shape, actual, strict=True)
            ]
        if shape != spec.shape or dtype != spec.dtype:
            warnings.append(
                f"output {spec.name!r} is declared {spec.dtype} {spec.shape}, but the model returns {dtype} {actual}: "
                f"the bundle's signature says {dtype} {shape}"
            )
            spec = spec.model_copy(update={"shape": shape, "dtype": dtype})
        fixed.append(spec)
    return fixed, warnings


def _budget(request: ConvertRequest, profile: Profile, plan: MetricPlan) -> Budget:
    """The user's budget or bar; else the profile's, widened to the default rule's own drop (a mask is judged by
    0.05 of IoU, not by the 0.01 of accuracy a profile allows a classifier)."""
    max_drop = request.max_drop if request.max_drop is not None else profile.accuracy_budget.max_drop
    if request.max_drop is None and request.min_score is None and plan.default_drop is not None:
        max_drop = max(max_drop, plan.default_drop)
    return Budget(
        max_drop=max_drop,
        min_sqnr_db=request.min_sqnr_db if request.min_sqnr_db is not None else profile.accuracy_budget.min_sqnr_db,
        min_score=request.min_score,
    )


def _convert_profile(
    request: ConvertRequest,
    loaded: SearchRequest,
    ws: Workspace,
    profile: Profile,
    facts: HostFacts,
    providers: frozenset[str],
    farm: Farm | None = None,
) -> ProfileResult:
    budget = _budget(request, profile, loaded.plan)
    if request.runtimes is not None:
        kept = [t for t in profile.targets if t.runtime in request.runtimes]
        skipped = [t.runtime for t in profile.targets if t.runtime not in request.runtimes]
        if not kept:
            why = f"no target with runtimes {list(request.runtimes)} (profile has {skipped})"
            return _failed(loaded, profile, why)
        profile = profile.model_copy(update={"targets": kept})
    try:
        found = search(loaded, ws, profile, budget, facts, providers, prune=farm is None and request.prune)
    except ConversionError as err:
        return _failed(loaded, profile, str(err))
    assert found.choice is not None
    on_devices = None
    if farm is not None:
        searched = found
        found, on_devices = choose_on_devices(searched, farm, lambda b, t, s: write_bundle(
            request, loaded, ws.work, searched, b, t, s, benchmark_only=True), ws.progress)  # fmt: skip
    assert found.choice is not None
    chosen = found.choice.chosen
    report = [asdict(c) for c in ([chosen] if chosen else []) + found.choice.rejected]
    limits: dict[str, object] | None = None
    lines: dict[str, dict[str, object]] = {}
    left = None if ws.deadline is None else ws.deadline - time.monotonic()
    if request.report and left is not None and left < ROOFLINE_MIN_LEFT_S:
        deadline.cut("roofline", f"not measured: {max(left, 0.0):.0f} s were left of the time budget")
    elif request.report:
        measure = left is None or left >= LIMITS_MIN_LEFT_S
        limits, lines = _rooflines(request, loaded, found, on_devices is not None, measure)
        if not measure and lines:
            deadline.cut("machine limits", f"not measured ({left or 0.0:.0f} s were left; on a busy machine it takes "
                         "tens of seconds): the rooflines are set against no limit")  # fmt: skip
    for candidate in report:
        line = lines.get(str(candidate["name"]), {})
        candidate["limit_pct"], candidate["bound"] = line.get("limit_pct"), line.get("bound")
    winner = found.winner()
    if chosen is None or winner is None:
        reasons = (
            "; ".join(found.notes) if not found.candidates else "no candidate met the accuracy budget and size limit"
        )
        result = _failed(loaded, profile, reasons)
        result.candidates, result.notes, result.worst_layers = report, found.notes, found.layer_reports
        result.roofline, result.limits = lines, limits
        return result
    built, target, status = winner.built, winner.target, winner.status
    ws.progress(f"{profile.name}: signing bundle ({chosen.name})")
    result = ProfileResult(
        profile.name, None, None, chosen.name, chosen.accuracy, loaded.ref_value, loaded.plan.name, chosen.latency_ms,
        chosen.size_bytes, report, format=target.format, runtime=target.runtime, provider=chosen.provider,
        measured=status.measurable or on_devices is not None, notes=found.notes,
        passes=[p.model_dump() for p in built.passes], worst_layers=found.layer_reports,
        farm=on_devices.model_dump(mode="json") if on_devices else None,
        head_to_head=found.head_to_head.as_dict() if found.head_to_head and on_devices is None else None,
        roofline=lines, limits=limits,
    )  # fmt: skip
    bundle_path, bundle_id = write_bundle(
        request, loaded, ws.work, found, built, target, status, on_devices, finish_by=ws.deadline
    )
    result.bundle, result.bundle_id = str(bundle_path), bundle_id
    signed = parse_manifest(read_signed_manifest(bundle_path).manifest_json)  # as signed, not recomputed
    held = signed.golden_hold
    result.golden = held.model_dump(mode="json") if held else None
    result.resources = signed.resources.model_dump(mode="json") if signed.resources else None
    return result


def _rooflines(
    request: ConvertRequest, loaded: SearchRequest, found: ProfileSearch, on_devices: bool, measure: bool = True
) -> tuple[dict[str, object] | None, dict[str, dict[str, object]]]:
    """This machine's limits at the timing's threads (measured once, cached) and each built candidate's roofline
    (converter.roofline). Figures the devices measured are set against no limit: theirs are not measured; nor are
    this machine's when `measure` is False (the time budget leaves too little to measure them)."""
    latency = {c.name: c.latency_ms for c in found.candidates if c.measured}
    artifacts, seen = [], set()
    for attempt in found.attempts:
        built = attempt.built
        if built.error is not None or built.spec.name in seen or not built.files:
            continue
        seen.add(built.spec.name)
        model = built.model_file
        graph: Path | onnx.ModelProto | None = (
            model if model.suffix in (".xml", ".onnx") and built.spec.kind != "coreml" else built.prepared.model
        )
        if built.proxy is not None:
            graph = built.proxy
        if graph is None:
            continue
        artifacts.append(Artifact(built.spec.name, built.spec.runtime, graph, latency.get(built.spec.name),
                                  built.spec.hint))  # fmt: skip
    if not artifacts:
        return None, {}
    threads = found.threads[0] if found.threads else loaded.threads
    limits = None if on_devices or not measure else machine_limits(threads, request.cache_dir)
    with phases.phase("roofline"):
        lines, limits = judge(artifacts, loaded.evaluation.sample(0), limits)
    if limits is not None and limits.raised:  # a candidate beat a measured peak: keep what it achieved
        limits = remember(limits, request.cache_dir)
    return (limits.as_dict() if limits else None), lines


def _failed(loaded: SearchRequest, profile: Profile, error: str) -> ProfileResult:
    return ProfileResult(
        profile.name, None, None, None, None, loaded.ref_value, loaded.plan.name, None, None, error=error
    )
