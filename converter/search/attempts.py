"""The build stage over a whole plan: each recipe's candidates in order (the declared recipe, then for a quantized
model that misses the bar its retries: other calibrations, the mixed preset, the head in float, then mixed
precision, converter.search.mixed), until one is inside the budget, the time budget is spent, or the plain
quantized model shows that its retries cannot win (converter.timing.pruning).

`build_all` returns every candidate built, with the notes and per-layer reports the report shows; it changes
nothing it is given.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import onnx

from edgefleet.converter import deadline, phases
from edgefleet.converter.onnx_graph import dynamic_inputs
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.heads import head_nodes
from edgefleet.converter.runners import Runner
from edgefleet.converter.search.build import build
from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.mixed import mixed_attempts
from edgefleet.converter.search.plan import (
    Recipe,
    TargetStatus,
    bf16_native,
    declared_specs,
    quantized_specs,
    spec_base,
    target_label,
)
from edgefleet.converter.search.prepare import prepare
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.search.types import Built, Prepared, Source, Spec
from edgefleet.converter.timing.pruning import Pruner, TimedRunner, retries_cannot_win
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import Profile, Target

RETRY_CALIBRATIONS: tuple[prec.CalibrationName, ...] = ("percentile", "entropy")
QUANT_RETRY_KINDS = ("ort-int8-static", "ov-nncf")


@dataclass(frozen=True)
class Attempt:
    """One built candidate, where it was built for, and its place in the profile's preference order."""

    built: Built
    target: Target
    status: TargetStatus
    order: int


@dataclass
class Builds:
    """What the build stage returns."""

    attempts: list[Attempt] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    layer_reports: dict[str, list[dict[str, object]]] = field(default_factory=dict)


def build_all(
    request: SearchRequest,
    ws: Workspace,
    profile: Profile,
    budget: Budget,
    recipes: Sequence[tuple[Recipe, Prepared]],
    threads: int,
    prune: bool,
) -> Builds:
    """Every recipe's candidates, in the order given (the plan's: cheap recipes first, so the first candidates
    inside the budget bound the costly ones). `threads`: the thread count that decides (evaluation is timed there).
    `prune`: drop candidates this host's timing says cannot win."""
    stage = _Stage(request, ws, profile, budget, threads, prune)
    for done, (recipe, prepared) in enumerate(recipes):
        target = recipe.target.target
        phases.step("build", done, len(recipes), f"{target.runtime} {recipe.precision}")
        # Only FP32 is built whatever the time budget says, until one FP32 candidate is inside the accuracy budget
        # (a conversion always has a float bundle); every other recipe, BF16 and FP16 included, is a build like any
        # other: not started once the time left is spent, stopped at the deadline (converter.deadline), the timing
        # reserve kept.
        exempt = recipe.precision == "fp32" and not any(
            a.built.passed and a.built.spec.precision == "fp32" for a in stage.out.attempts
        )
        if _spent(ws) and not exempt:
            label = f"{target_label(target)} {recipe.precision}"
            stage.out.notes.append(f"{label} not tried: the time budget is spent")
            deadline.cut(label, "not tried: the time budget was spent before it could start")
            continue
        with deadline.until(None if exempt else ws.build_deadline, ws.budget_s or 0.0):
            before = len(stage.out.attempts)
            stage.precision(recipe, prepared)
        for attempt in stage.out.attempts[before:]:
            if attempt.built.error and attempt.built.error.startswith("stopped: the time budget"):
                deadline.cut(attempt.built.spec.name, "stopped at the deadline before it finished: not judged")
        if ws.deadline is not None:  # a slow model needs more of the budget for its timing and golden set
            fastest_s = _fastest_s(stage.out.attempts)
            ws.finish_s = max(ws.finish_s, bundle_share_s(request, fastest_s))
            ws.reserve_s = max(ws.reserve_s, RESERVE_RUNS * fastest_s + ws.finish_s)
    phases.step("build", len(recipes), len(recipes), "done")
    return stage.out


RESERVE_RUNS = 100  # inferences the timing takes after the builds (the finalists' rounds at the fewest runs)
RESERVE_FIXED_S = 3.0  # ... and the bundle: signing, the manifest
GOLDEN_BYTES_PER_S = 30e6  # ... its golden set: inputs, reference and expected outputs, deflated
PROBE_START_S = 2.0  # ... and its peak-memory probe: a fresh interpreter importing the runtime ...
PROBE_RUNS = 22  # ... and running the model (converter.resources: a warm-up, RUNS, a margin)


def _fastest_s(attempts: Sequence[Attempt]) -> float:
    """The evaluation median of the fastest candidate inside the budget, in seconds (0 before there is one)."""
    medians = [statistics.median(a.built.eval_ms) for a in attempts if a.built.passed and a.built.eval_ms]
    return min(medians, default=0.0) / 1000.0


def bundle_share_s(request: SearchRequest, run_s: float) -> float:
    """What the bundle needs after the timing, for a model at `run_s` a run: the golden set's compression (u2netp's
    is 118 MB of float maps), the peak-memory probe, and RESERVE_FIXED_S. The timing keeps it (`ws.finish_s`), and
    the builds keep it with RESERVE_RUNS of the fastest candidate for the timing (`ws.reserve_s`)."""
    golden = sum(v.nbytes for v in request.evaluation.inputs.values()) + 2 * sum(
        v.nbytes for v in request.reference.values()
    )
    return golden / GOLDEN_BYTES_PER_S + PROBE_START_S + PROBE_RUNS * run_s + RESERVE_FIXED_S


def _spent(ws: Workspace, need_s: float = 0.0) -> bool:
    """Whether --time-budget leaves less than `need_s` for another build, the timing reserve kept aside."""
    return ws.spent(need_s)


@dataclass
class _Stage:
    request: SearchRequest
    ws: Workspace
    profile: Profile
    budget: Budget
    threads: int
    prune: bool
    pruner: Pruner = field(default_factory=Pruner)
    out: Builds = field(default_factory=Builds)

    def precision(self, recipe: Recipe, prepared: Prepared) -> None:
        """One precision's candidates in order, until one is inside the budget, the time budget is spent, or the
        plain quantized model shows that its retries cannot win."""
        target, status = recipe.target.target, recipe.target.status
        order = recipe.order * 100
        bound: list[float] = []  # the first built candidate's evaluation times: its retries are no faster
        prune = self.pruner if status.measurable and self.prune else None
        started = time.monotonic()
        for built in self._attempts(target, status, prepared, recipe.precision, prune, recipe.source):
            took, started = time.monotonic() - started, time.monotonic()
            order += 1
            self.out.attempts.append(Attempt(built, target, status, order))
            self.out.notes.extend(f"{built.spec.name}: {n}" for n in built.notes)
            if built.passed:
                if prune is not None and built.size_bytes <= self.profile.size_limit_mb * 1e6:
                    prune.accept(built.spec.name, self._evidence(built), self._runner_of(built))
                return
            if _spent(self.ws, took):
                self.out.notes.append(
                    f"{built.spec.name}: no further retries: the time budget is spent (a retry takes about "
                    f"{took:.0f} s, and the timing needs {self.ws.reserve_s:.0f} s)"
                )
                if not (built.error or "").startswith("stopped: the time budget"):
                    deadline.cut(f"{built.spec.name} retries", f"not tried: a retry takes about {took:.0f} s")
                return
            # Each retry keeps at least as much in float as the one before: the latest is the tightest bound.
            bound = built.eval_ms if len(built.eval_ms) >= len(bound) else bound
            if prune is not None and built.error is None and prune.beaten(bound):
                why = self._confirm(built, prune)
                if why:
                    self.out.notes.append(f"{built.spec.name}: retries not built: {why.removeprefix('pruned: ')}")
                    return

    def _evidence(self, built: Built) -> list[float]:
        """Latency evidence for a candidate inside the budget: its evaluation times, or a few runs when it came
        from the build cache."""
        if built.eval_ms:
            return built.eval_ms
        evaluation = self.request.evaluation
        try:
            timed = TimedRunner(built.runner(self.threads, self.request.output_names), None)
            with phases.phase("timing"):
                for index in range(min(5, len(evaluation))):
                    timed(evaluation.sample(index))
        except (ConversionError, RuntimeError, ValueError):
            return []
        built.eval_ms = timed.samples_ms
        return timed.samples_ms

    def _runner_of(self, built: Built) -> Callable[[], Runner]:
        return lambda: built.runner(self.threads, self.request.output_names)

    def _confirm(self, built: Built, pruner: Pruner) -> str | None:
        """Head to head against the best candidate inside the budget: can this quantized model (and so its
        retries, which keep more in float) still win?"""
        try:
            run = built.runner(self.threads, self.request.output_names)
            with phases.phase("timing"):
                return pruner.confirm(run, self.request.evaluation.sample(0))
        except ConversionError:
            return None

    def _build(self, status: TargetStatus, prepared: Prepared, spec: Spec, pruner: Pruner | None) -> Built:
        if not status.measurable and spec.precision.startswith("int8"):
            spec = replace(spec, as_written=True)  # a proxy: the graph's int8 arithmetic, not this CPU's
        return build(self.request, self.ws, prepared, spec, self.budget, threads=self.threads, pruner=pruner)

    def _attempts(
        self,
        target: Target,
        status: TargetStatus,
        prepared: Prepared,
        precision: str,
        pruner: Pruner | None,
        source: Source = "model",
    ) -> Iterator[Built]:
        """Candidates for one precision, in order; the caller stops at the first inside the budget. `source`: a
        model that arrives quantized is kept as it is, or its float graph (prepared) starts the usual recipes."""
        request, ws, name = self.request, self.ws, self.profile.name
        base = spec_base(target, prepared.static_from_data) + {"dequantized": "-dq", "fused": "-fused"}.get(source, "")
        run_on = status.run_on
        hint = target.inference_precision_hint
        first: Built | None = None
        if source == "as-quantized":
            specs = quantized_specs(base, target, run_on, hint, precision)
        else:
            specs = declared_specs(base, target, run_on, hint, precision, transformer=request.encoder is not None)
        for spec in specs:
            ws.progress(f"{name}: building {spec.name}")
            first = self._build(status, prepared, spec, pruner)
            yield first
        if first is None:
            return
        if (
            first.error
            and not first.pruned
            and not first.error.startswith("not suited")
            and not prepared.static_from_data
            and source != "fused"  # the fused graph is ONNX Runtime's: its kernels take dynamic shapes
            and dynamic_inputs(prepared.model or onnx.ModelProto())
        ):
            # OpenVINO (and some EPs) cannot compile graphs whose control flow depends on dynamic shapes: retry
            # with the dimensions the data uses.
            opset = self.profile.opset
            static = prepare(request, ws, opset.min, opset.max, True, self.budget, prepared.decomposed, source)
            if static.model is not None:
                yield from self._attempts(target, status, static, precision, pruner, source)
            return
        if first.error or first.gate is None or precision != "int8-static" or first.spec.kind not in QUANT_RETRY_KINDS:
            return  # TensorRT's INT8 is calibrated on the device from the table: nothing to retry here
        bf16 = "bf16" in target.precisions and bf16_native(run_on)
        why = self._retries_cannot_win(first, pruner, bf16) if pruner is not None else None
        if why:
            self.out.notes.append(f"{first.spec.name}: no retries (calibrations, float layers, mixed precision): {why}")
            return
        if first.spec.kind == "ort-int8-static":
            assert isinstance(first.spec.config, prec.StaticConfig)
            config = first.spec.config
            for method in RETRY_CALIBRATIONS:
                spec = replace(first.spec, name=f"{base}-int8-static-{method}",
                               config=dataclasses.replace(config, calibration=method))  # fmt: skip
                ws.progress(f"{name}: retrying INT8 with {method} calibration")
                built = self._build(status, prepared, spec, pruner)
                yield built
                if built.passed:
                    return
        if first.spec.kind == "ov-nncf":
            assert isinstance(first.spec.config, ovp.NNCFConfig)
            mixed = dataclasses.replace(first.spec.config, preset="mixed")  # an encoder keeps its scheme
            spec = Spec(f"{base}-int8-nncf-mixed", "ov-nncf", precision, target.runtime, target.format, run_on,
                        mixed, hint=hint)  # fmt: skip
            ws.progress(f"{name}: retrying NNCF INT8 with the mixed preset")
            built = self._build(status, prepared, spec, pruner)
            yield built
            if built.passed:
                return
        assert prepared.model is not None
        if request.plan.kind == "detection":  # a detector's head decides its detections: keep it in float first
            names = tuple(head_nodes(prepared.model, request.output_names))
            if first.spec.kind == "ort-int8-static":
                assert isinstance(first.spec.config, prec.StaticConfig)
                config = dataclasses.replace(first.spec.config, exclude_nodes=names)
                spec = replace(first.spec, name=f"{base}-int8-static-head-float", config=config)
            else:
                assert isinstance(first.spec.config, ovp.NNCFConfig)
                head = dataclasses.replace(first.spec.config, preset="mixed", ignored_nodes=names)
                spec = Spec(f"{base}-int8-nncf-head-float", "ov-nncf", precision, target.runtime, target.format,
                            run_on, head, hint=hint)  # fmt: skip
            ws.progress(f"{name}: retrying INT8 with the head in float")
            built = self._build(status, prepared, spec, pruner)
            yield built
            if built.passed or ws.out_of_time():
                return
        yield from mixed_attempts(
            request, ws, prepared, first, base, self.budget, self.out.notes, self.out.layer_reports, bf16
        )

    def _retries_cannot_win(self, first: Built, pruner: Pruner, bf16: bool) -> str | None:
        """converter.timing.pruning.retries_cannot_win, with `first` compiled with the fastest hint a retry gets
        (bf16 where NNCF's accuracy-control variants try it)."""
        bound = first
        if first.spec.kind == "ov-nncf" and bf16 and first.spec.hint != "bf16":
            bound = replace(first, spec=replace(first.spec, hint="bf16"))
        note = " (compiled with the bf16 hint its variants get)" if bound is not first else ""
        precisions = {a.built.spec.name: a.built.spec.precision for a in self.out.attempts}
        try:
            run = bound.runner(self.threads, self.request.output_names)
            with phases.phase("timing"):
                return retries_cannot_win(
                    pruner, run, self.request.evaluation.sample(0), first.spec.precision, precisions, note
                )
        except ConversionError:
            return None
