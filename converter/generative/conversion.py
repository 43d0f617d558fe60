"""`convert_generative`: a decoder-only language model → one signed generative bundle per hardware profile.

Order of work: check the model, the bars and the text files before writing anything; plan every profile's
candidates (candidates.py); build each artifact once (builders/); judge every candidate against FP32 on the same
held-out windows (judge.py); time those inside the bars and on this host's hardware, interleaved, at each
profile's threads (timing.py); set them against the measured read bandwidth (limit.py); per profile, choose
(choose.py), write the golden prompts from FP32 with the chosen artifact's own floors (golden.py) and sign the
bundle (bundle.py). The work directory inside `out` is removed whatever happens.

The time budget (`--time-budget`; the CLI's default for a language model is DEFAULT_LM_TIME_BUDGET_S in
edgefleet/cli/convert/command.py) counts from the start. Builds go cheapest first and may run until BUILD_SHARE of
it: later ones are not started, and a model of OWN_PROCESS_FROM_BYTES or more builds each in its own process
(builders/), stopped if still running then (each is listed as cut, with the reason). Judging, timing and signing what
was built take the rest; they are not cut, and the result says how long the whole conversion took. An artifact over
the size limit of every profile that plans it is refused as soon as it is built: it is neither judged nor timed.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from edgefleet.converter import deadline, phases
from edgefleet.converter.generative.bars import (
    DEFAULT_MAX_PERPLEXITY_RATIO,
    DEFAULT_MIN_NEXT_TOKEN_AGREEMENT,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    QualityBars,
)
from edgefleet.converter.generative.builders import Builder, build_order
from edgefleet.converter.generative.bundle import BundleInputs, write_generative_bundle
from edgefleet.converter.generative.candidates import BuildRecipe, CandidateSpec, HostView, Skipped, plan_target
from edgefleet.converter.generative.choose import Judged, choose, over_every_limit
from edgefleet.converter.generative.golden import GoldenReference, OwnFigures, device_golden, golden_reference
from edgefleet.converter.generative.judge import Reference, reference_of, score
from edgefleet.converter.generative.limit import ReadBandwidth, limit_of, read_bandwidth, weights_read_per_token
from edgefleet.converter.generative.memory import memory_at_context
from edgefleet.converter.generative.record import CandidateRecord
from edgefleet.converter.generative.runtimes import REFERENCE, GenerativeRunner, open_runner
from edgefleet.converter.generative.source import DecoderSource, load_decoder
from edgefleet.converter.generative.text import TextData, load_text
from edgefleet.converter.generative.timing import interleaved
from edgefleet.converter.request import ConvertRequest, ProfileResult
from edgefleet.core.bundle.manifest import parse_version
from edgefleet.core.errors import UserInputError
from edgefleet.core.profiles import HostFacts, Profile, match_reasons
from edgefleet.core.quality.generation import GoldenPrompts

log = logging.getLogger(__name__)
__all__ = ["convert_generative"]

METRIC = "next-token-agreement"
ONNX_ONLY = {
    "max_drop": "--max-drop", "min_sqnr_db": "--min-sqnr", "min_score": "--min-score", "metric": "--metric",
    "pins": "--pin", "fix_dims": "--fix-dim", "input_shapes": "--input-shape", "torch_model": "--torch-model",
}  # fmt: skip
TARGET_STRIDE = 100  # candidates' order: target index x this + the precision's index
BUILD_SHARE = 0.6  # of the time budget, for builds; judging, timing and signing what was built take the rest
# Weights from which, under a time budget, each build runs in its own process. A child pays for its own imports
# (torch, transformers, the builders: seconds, against under one for a tinylm build once they are imported), which
# only a model whose builds take minutes repays.
OWN_PROCESS_FROM_BYTES = 100_000_000


@dataclass(frozen=True)
class _ProfilePlan:
    profile: Profile
    threads: int
    candidates: list[CandidateSpec]
    skipped: list[Skipped]
    notes: list[str]


def convert_generative(
    request: ConvertRequest, progress: Callable[[str], None] = lambda _msg: None
) -> list[ProfileResult]:
    """Build, judge, time and sign one generative bundle per profile. User errors come before anything is written."""
    started = time.monotonic()
    given = [flag for field, flag in ONNX_ONLY.items() if getattr(request, field)]
    if given:
        raise UserInputError(
            f"{', '.join(given)}: for ONNX models; a language model is judged by --max-perplexity-ratio and "
            "--min-next-token-agreement"
        )
    try:
        parse_version(request.version)
        bars = QualityBars(
            max_perplexity_ratio=_or(request.max_perplexity_ratio, DEFAULT_MAX_PERPLEXITY_RATIO),
            min_next_token_agreement=_or(request.min_next_token_agreement, DEFAULT_MIN_NEXT_TOKEN_AGREEMENT),
        )
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        raise UserInputError(_first_line(err)) from err
    source = load_decoder(request.model)
    prompt_tokens = int(_or(request.prompt_tokens, DEFAULT_PROMPT_TOKENS))
    output_tokens = int(_or(request.output_tokens, DEFAULT_OUTPUT_TOKENS))
    if prompt_tokens < 1 or output_tokens < 2 or prompt_tokens + output_tokens > source.context_length:
        raise UserInputError(
            f"--prompt-tokens {prompt_tokens} and --output-tokens {output_tokens}: give a prompt of at least 1 token "
            f"and at least 2 output tokens, together at most the model's context of {source.context_length}"
        )
    text = load_text(source.path / "tokenizer.json", request.calib, request.eval, source.context_length)
    text.prompt(prompt_tokens)  # a DataError now rather than at timing
    plans = [_plan(request, profile, source) for profile in request.profiles]
    specs = _unique([spec for plan in plans for spec in plan.candidates])
    request.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".edgefleet-convert-", dir=request.out) as tmp:
        work = Path(tmp)
        conversion = _Conversion(request, source, text, bars, prompt_tokens, output_tokens, work, progress, started)
        return conversion.run(plans, specs)


class _Conversion:
    """One conversion's state: the built artifacts, the open runners, the reference, the candidates' records."""

    def __init__(
        self,
        request: ConvertRequest,
        source: DecoderSource,
        text: TextData,
        bars: QualityBars,
        prompt_tokens: int,
        output_tokens: int,
        work: Path,
        progress: Callable[[str], None],
        started: float,
    ) -> None:
        self.request, self.source, self.text, self.bars = request, source, text, bars
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.work, self.progress, self.started = work, progress, started
        self.threads = request.threads
        self.budget_s = request.time_budget_s or None
        self.isolate = self.budget_s is not None and source.weights_bytes >= OWN_PROCESS_FROM_BYTES
        self.builder = Builder(source, text.calibration(), work / "artifacts", request.threads, isolate=self.isolate)
        self.runners: dict[tuple[str, int], GenerativeRunner] = {}
        self.records: dict[str, CandidateRecord] = {}  # built and judged, by candidate name
        self.timed: dict[tuple[str, int], CandidateRecord] = {}  # ... and timed, by name and threads
        self.golden_docs: dict[str, tuple[GoldenPrompts, OwnFigures]] = {}

    def run(self, plans: list[_ProfilePlan], specs: dict[str, CandidateSpec]) -> list[ProfileResult]:
        try:
            with deadline.recording_cuts() as cuts:
                self._build(specs)
            self._refuse_oversized(specs, plans)
            reference, golden = self._reference()
            self._judge(specs, reference, plans)
            bandwidth = self._time(plans)
            results = [self._profile(plan, reference, golden, bandwidth) for plan in plans]
            if self.budget_s is not None:
                for plan, result in zip(plans, results, strict=True):
                    result.time_budget = self._budget_record(plan, cuts)
            if self.request.report:
                self._report(results, reference, bandwidth)
            return results
        finally:
            for runner in self.runners.values():
                runner.close()

    # --- build --------------------------------------------------------------------------------------------------

    def _build(self, specs: dict[str, CandidateSpec]) -> None:
        """Every candidate's artifact, cheapest first, within the budget's build share."""
        by_recipe = {spec.build.key: spec.build for spec in specs.values()}
        order = {recipe.key: index for index, recipe in enumerate(build_order(list(by_recipe.values())))}
        ordered = sorted(specs.values(), key=lambda spec: order[spec.build.key])
        until = None if self.budget_s is None else self.started + BUILD_SHARE * self.budget_s
        with deadline.until(until, self.budget_s or 0.0):
            for index, spec in enumerate(ordered):
                phases.step("build", index, len(ordered), spec.name)
                left = "" if until is None else f"; {max(0.0, until - time.monotonic()):.0f} s left for builds"
                self.progress(f"building {spec.name} ({index + 1}/{len(ordered)}): {spec.description}{left}")
                with phases.phase("quantize" if spec.build.base else "export"):
                    artifact = self.builder.build(spec.build)
                self.records[spec.name] = CandidateRecord(spec, artifact, error=artifact.error)
        phases.step("build", len(ordered), len(ordered))

    def _refuse_oversized(self, specs: dict[str, CandidateSpec], plans: list[_ProfilePlan]) -> None:
        """Candidates that can ship nowhere for their size are refused as soon as they are built: neither judged nor
        timed (a language model's FP32 build can be the largest thing the conversion would hold)."""
        built = {name: self.records[name] for name in specs if self.records[name].error is None}
        limits = {name: [p.profile.size_limit_mb for p in plans if any(s.name == name for s in p.candidates)]
                  for name in built}  # fmt: skip
        sizes = {name: record.artifact.size_bytes for name, record in built.items()}
        for name, refusal in over_every_limit(sizes, limits).items():
            self.records[name] = replace(self.records[name], error=refusal)

    def _budget_record(self, plan: _ProfilePlan, cuts: list[deadline.Cut]) -> dict[str, object]:
        """What the time budget cut among this profile's builds, and how long the whole conversion took."""
        keys: set[str] = set()
        for spec in plan.candidates:
            recipe: BuildRecipe | None = spec.build
            while recipe is not None:
                keys.add(recipe.key)
                recipe = recipe.base
        return {
            "budget_s": self.budget_s,
            "build_share_s": round(BUILD_SHARE * (self.budget_s or 0.0), 1),
            "builds_in": "their own processes" if self.isolate else "the converter's process",
            "seconds": round(time.monotonic() - self.started, 1),
            "cut": [{"what": c.what, "how": c.how} for c in cuts if c.what in keys],
        }

    # --- judge --------------------------------------------------------------------------------------------------

    def _reference(self) -> tuple[Reference, GoldenReference]:
        """FP32 on the judged windows and the golden prompts: the Hugging Face model in transformers, or an
        exported model as it arrived."""
        self.progress("reference: FP32 on the held-out text")
        if self.source.kind == "hf":
            runner = open_runner(REFERENCE, self.source.path, self.threads, self.source.eos_token_ids)
        else:  # an exported model: as it arrived (the same artifact as its as-is candidate)
            recipe = BuildRecipe(key="ort-as-is", method="ort-as-is", params={"arrived": self.source.arrived_precision})
            as_is = self.builder.build(recipe)
            if as_is.folder is None:
                raise UserInputError(f"the model {self.source.path} cannot be read: {as_is.error}")
            runner = open_runner("onnxruntime-genai", as_is.folder, self.threads, self.source.eos_token_ids)
        with phases.phase("accuracy"):
            reference = reference_of(runner, self.text.judged())
            decode = _decoder(self.source.path / "tokenizer.json")
            golden = golden_reference(runner, self.text.unjudged(), self.source.context_length, decode)
        runner.close()
        return reference, golden

    def _judge(self, specs: dict[str, CandidateSpec], reference: Reference, plans: list[_ProfilePlan]) -> None:
        threads = {spec.name: plan.threads for plan in plans for spec in plan.candidates}
        for index, spec in enumerate(specs.values()):
            record = self.records[spec.name]
            phases.step("accuracy", index, len(specs), spec.name)
            if record.artifact.folder is None or record.error:  # failed, cut, or refused for its size
                continue
            self.progress(f"judging {spec.name} on {reference.tokens} held-out tokens")
            try:
                with phases.phase("accuracy"):
                    runner = self._runner(spec, threads[spec.name])
                    scores = score(runner, reference)
                weights = weights_read_per_token(record.artifact.folder, spec.runtime, self.source.vocab_size)
            except Exception as err:  # the runtime's own failure to load or run it: recorded, the others go on
                log.info("judging %s failed", spec.name, exc_info=True)
                self.records[spec.name] = replace(record, error=f"does not run on this host: {_first_line(err)}")
                self._release(spec.name)
                continue
            self.records[spec.name] = replace(record, scores=scores, weights_bytes=weights)
            if not spec.measurable or self._refusal(self.records[spec.name]):
                self._release(spec.name)  # not timed: its memory back before the next one loads
        phases.step("accuracy", len(specs), len(specs))

    # --- time ---------------------------------------------------------------------------------------------------

    def _time(self, plans: list[_ProfilePlan]) -> dict[int, ReadBandwidth]:
        """Interleaved TTFT/TPOT for every candidate inside the bars that this host can time, per thread count."""
        groups: dict[int, dict[str, CandidateSpec]] = {}
        for plan in plans:
            for spec in plan.candidates:
                record = self.records[spec.name]
                if spec.measurable and record.scores and not self._refusal(record):
                    groups.setdefault(plan.threads, {})[spec.name] = spec
        bandwidth: dict[int, ReadBandwidth] = {}
        for threads, group in groups.items():
            self.progress(f"timing {len(group)} candidates at {threads} thread(s), interleaved")
            runners = {name: self._runner(spec, threads) for name, spec in group.items()}
            prompt = self.text.prompt(self.prompt_tokens)
            with phases.phase("timing"):
                times = interleaved(runners, prompt, self.output_tokens,
                                    on_round=lambda done, total: phases.step("timing", done, total))  # fmt: skip
            with phases.phase("roofline"):
                bandwidth[threads] = read_bandwidth(threads, self.request.cache_dir)
            for name, figures in times.items():
                record = self.records[name]
                limit = limit_of(record.weights_bytes, bandwidth[threads], figures.tpot_ms)
                self.timed[(name, threads)] = replace(record, times=figures, limit=limit)
        return bandwidth

    def _view(self, spec: CandidateSpec, threads: int) -> CandidateRecord:
        """The candidate as one profile sees it: its own spec (order, whether its hardware is here) and the
        figures timed at the profile's threads, only where the profile's hardware is this host."""
        record = self.records[spec.name]
        if spec.measurable:
            record = self.timed.get((spec.name, threads), record)
        return replace(record, spec=spec)

    # --- per profile --------------------------------------------------------------------------------------------

    def _profile(
        self, plan: _ProfilePlan, reference: Reference, golden: GoldenReference, bandwidth: dict[int, ReadBandwidth]
    ) -> ProfileResult:
        profile = plan.profile
        limit_bytes = int(profile.size_limit_mb * 1e6)
        judged = []
        views = {spec.name: self._view(spec, plan.threads) for spec in plan.candidates}
        for spec in plan.candidates:
            record = views[spec.name]
            refused = self._refusal(record)
            if not refused and record.artifact.size_bytes > limit_bytes:
                refused = f"{record.artifact.size_bytes / 1e6:.1f} MB is over the profile's {profile.size_limit_mb} MB"
            judged.append(Judged(spec.name, spec.order, refused, record.times.tpot_ms if record.times else None,
                                 record.artifact.size_bytes))  # fmt: skip
        decision = choose(judged)
        notes = [*plan.notes, *(f"{s.name}: not built: {s.reason}" for s in plan.skipped)]
        notes.append(f"FP32 reference perplexity {reference.perplexity:.4f} on {reference.tokens} held-out tokens")
        rows = [views[s.name].as_dict(decision.reasons.get(s.name), s.name == decision.chosen)
                | memory_at_context(self.source, s, views[s.name].artifact.size_bytes).as_row()
                for s in plan.candidates]  # fmt: skip
        limits = self._limits(plan, reference, bandwidth)
        if decision.chosen is None:
            return ProfileResult(
                profile.name, None, None, None, None, 1.0, METRIC, None, None, rows,
                error="no candidate passed: " + "; ".join(f"{n}: {r}" for n, r in decision.reasons.items())
                if decision.reasons else "no candidate was planned for this profile", notes=notes, limits=limits,
            )  # fmt: skip
        chosen = views[decision.chosen]
        notes.append(f"chose {chosen.name}: {decision.how}")
        notes.append(
            f"{chosen.name}: {memory_at_context(self.source, chosen.spec, chosen.artifact.size_bytes).summary()}"
        )
        self.progress(f"{profile.name}: golden prompts and signing ({chosen.name})")
        document, own = self._golden(chosen, golden, plan.threads)
        notes.append(
            f"golden prompts: {chosen.name} here scores next-token {own.next_token_agreement:.4f}, continuation "
            f"{own.continuation_agreement:.4f}, perplexity {own.perplexity_ratio:.4f}x FP32's; the device's floors "
            f"{document.min_next_token_agreement}, {document.min_continuation_agreement}, "
            f"{document.max_perplexity_ratio}x"
        )
        target = next(t for t in profile.generation
                      if t.runtime == chosen.spec.runtime and chosen.spec.provider in t.providers)  # fmt: skip
        bundle_inputs = BundleInputs(
            profile=profile, target=target, chosen=chosen, judged=list(views.values()),
            source=self.source, reference=reference, bars=self.bars, golden=document, threads=plan.threads,
            prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
        )  # fmt: skip
        path, manifest = write_generative_bundle(self.request, bundle_inputs, self.work / f"bundle-{profile.name}")
        assert chosen.scores is not None
        return ProfileResult(
            profile.name, str(path), manifest.bundle_id, chosen.name, chosen.scores.agreement, 1.0, METRIC,
            chosen.times.tpot_ms if chosen.times else None, chosen.artifact.size_bytes, rows, format=target.format,
            runtime=chosen.spec.runtime, provider=chosen.spec.provider, measured=chosen.times is not None,
            notes=notes, passes=[p.model_dump() for p in chosen.artifact.passes], limits=limits,
        )  # fmt: skip

    def _refusal(self, record: CandidateRecord) -> str | None:
        if record.error:
            return record.error
        if record.scores is None:
            return "not judged"
        return self.bars.refusal(record.scores.perplexity_ratio, record.scores.agreement)

    def _golden(
        self, chosen: CandidateRecord, golden: GoldenReference, threads: int
    ) -> tuple[GoldenPrompts, OwnFigures]:
        if chosen.name not in self.golden_docs:
            runner = self._runner(self.records[chosen.name].spec, threads)
            with phases.phase("accuracy"):
                self.golden_docs[chosen.name] = device_golden(runner, golden)
        return self.golden_docs[chosen.name]

    def _limits(
        self, plan: _ProfilePlan, reference: Reference, bandwidth: dict[int, ReadBandwidth]
    ) -> dict[str, object]:
        found = bandwidth.get(plan.threads)
        return {
            "threads": plan.threads,
            "read_bandwidth_gb_s": found.gb_s if found else None,
            "bandwidth_method": found.method if found else None,
            "load_average": found.load_average if found else None,
            "reference_perplexity": reference.perplexity,
            "judged_tokens": reference.tokens,
            "max_perplexity_ratio": self.bars.max_perplexity_ratio,
            "min_next_token_agreement": self.bars.min_next_token_agreement,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }

    # --- runners ------------------------------------------------------------------------------------------------

    def _runner(self, spec: CandidateSpec, threads: int) -> GenerativeRunner:
        """The candidate's runner at `threads`, opened once. A candidate this host cannot time is judged on its CPU
        with exact f32 settings (its weights as built); one it times runs with its own properties."""
        key = (spec.name, threads)
        if key not in self.runners:
            record = self.records[spec.name]
            assert record.artifact.folder is not None
            config = spec.runtime_config
            if not spec.measurable and spec.runtime == "openvino-genai":
                config = {"INFERENCE_PRECISION_HINT": "f32"}
            self.runners[key] = open_runner(spec.runtime, record.artifact.folder, threads, self.source.eos_token_ids,
                                            config)  # fmt: skip
        return self.runners[key]

    def _release(self, name: str) -> None:
        for key in [k for k in self.runners if k[0] == name]:
            self.runners.pop(key).close()

    # --- report -------------------------------------------------------------------------------------------------

    def _report(self, results: list[ProfileResult], reference: Reference, bandwidth: dict[int, ReadBandwidth]) -> None:
        from dataclasses import asdict

        document = {
            "model": str(self.request.model),
            "source_sha256": self.source.sha256,
            "name": self.request.name,
            "version": self.request.version,
            "kind": "generative",
            "source": self.source.describe(),
            "metric": METRIC,
            "reference_perplexity": reference.perplexity,
            "judged_tokens": reference.tokens,
            "bars": self.bars.model_dump(),
            "read_bandwidth": {str(t): asdict(b) for t, b in bandwidth.items()},
            "profiles": [asdict(r) for r in results],
        }
        path = self.request.out / f"{self.request.name}-{self.request.version}.report.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(document, indent=2, default=str), "utf-8")
        tmp.replace(path)


def _plan(request: ConvertRequest, profile: Profile, source: DecoderSource) -> _ProfilePlan:
    """The profile's candidates in its order, and why any precision has none."""
    threads = profile.threads[0] if profile.threads else request.threads
    if not profile.generation:
        return _ProfilePlan(profile, threads, [], [], [f"{profile.name} lists no generation runtime"])
    facts = HostFacts.probe(profile.match.files)
    misses = match_reasons(profile, facts)
    host = HostView(
        providers=_host_providers(), is_profile_hardware=not misses,
        not_profile_reason=f"this host is not {profile.name} ({'; '.join(misses)})" if misses else "",
        cpu_bf16=bool(facts.cpu_flags & {"avx512_bf16", "amx_bf16"}),
    )  # fmt: skip
    candidates, skipped, notes = [], [], []
    for index, target in enumerate(profile.generation):
        if request.runtimes is not None and target.runtime not in request.runtimes:
            notes.append(f"{target.runtime}: left out (--runtime {', '.join(request.runtimes)})")
            continue
        planned = plan_target(target, source, host, index * TARGET_STRIDE)
        candidates += planned.candidates
        skipped += planned.skipped
        notes += planned.notes
    return _ProfilePlan(profile, threads, candidates, skipped, notes)


def _host_providers() -> frozenset[str]:
    """The generative providers this host can run and time: the runtimes' CPU devices where they import."""
    found = set()
    try:
        import onnxruntime_genai  # noqa: F401

        found.add("onnxruntime-genai:cpu")
    except ImportError:
        pass
    try:
        import openvino as ov
        import openvino_genai  # noqa: F401

        devices = [d.split(".")[0] for d in ov.Core().available_devices]  # GPU.0, GPU.1: GPU
        found |= {f"openvino-genai:{d}" for d in devices if d in ("CPU", "GPU", "NPU")}
    except ImportError:
        pass
    return frozenset(found)


def _unique(specs: list[CandidateSpec]) -> dict[str, CandidateSpec]:
    """Candidates of all profiles by name: the same name is the same artifact and settings, built and judged once
    (only the order and whether it is timed may differ between profiles; timed anywhere is timed)."""
    found: dict[str, CandidateSpec] = {}
    for spec in specs:
        known = found.get(spec.name)
        if known is None or (spec.measurable and not known.measurable):
            found[spec.name] = spec
    return found


def _decoder(tokenizer_json: Path) -> Callable[[list[int]], str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _first_line(err: BaseException) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
