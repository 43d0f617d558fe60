"""Signing a generative candidate as its profile's bundle: the runtime's folder under `model/`, golden_prompts.json,
and the manifest with its `generation` block (format onnx-genai or openvino-genai). Content-addressed and signed
like any bundle (edgefleet.core.bundle.archive); the file appears in `out` only when complete.

The device reports each request's TPOT as its latency, so the manifest's latency is TPOT (median, p90), and the
control plane's latency guardrail compares like with like. Accuracy is next-token agreement against FP32.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from edgefleet.converter.generative.bars import QualityBars
from edgefleet.converter.generative.judge import Reference
from edgefleet.converter.generative.record import CandidateRecord
from edgefleet.converter.generative.source import DecoderSource
from edgefleet.converter.request import ConvertRequest
from edgefleet.converter.resources import measure_memory, resource_needs
from edgefleet.core.bundle.archive import describe_files, pack_bundle, sha256_file
from edgefleet.core.bundle.generation import GenerationSpec, GenerativeQuality, TokenLatency
from edgefleet.core.bundle.manifest import (
    AccuracyReport,
    GoldenSpec,
    LatencyReport,
    Manifest,
    Recipe,
    ResourceNeeds,
    SearchReport,
    TensorSpec,
)
from edgefleet.core.bundle.runtime_config import ConfigRefused, check_genai_config, check_runtime_config, runtime_of
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import GenerativeTarget, Profile
from edgefleet.core.quality.generation import GoldenPrompts

__all__ = ["GOLDEN", "MODEL_DIR", "BundleInputs", "check_runtime_configuration", "write_generative_bundle"]

log = logging.getLogger(__name__)

MODEL_DIR = "model"
GOLDEN = "golden_prompts.json"
ENTRY = {"onnxruntime-genai": "genai_config.json", "openvino-genai": "openvino_model.xml"}
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class BundleInputs:
    """Everything one profile's bundle is made of, beside the request."""

    profile: Profile
    target: GenerativeTarget
    chosen: CandidateRecord
    judged: list[CandidateRecord]  # every candidate judged for the profile (the search report's scores)
    source: DecoderSource
    reference: Reference
    bars: QualityBars
    golden: GoldenPrompts
    threads: int
    prompt_tokens: int
    output_tokens: int


def check_runtime_configuration(folder: Path, runtime_config: dict[str, str | int], target: GenerativeTarget) -> None:
    """ConversionError unless devices would pass the bundle's runtime configuration on (edgefleet/core/bundle/
    runtime_config.py): its runtime_config and, for ONNX Runtime GenAI, the folder's genai_config.json (a model
    brought with its own may hold keys a device refuses, such as a custom_ops_library)."""
    try:
        check_runtime_config(runtime_of(target.format), runtime_config)
        config = folder / "genai_config.json"
        if target.format == "onnx-genai" and config.is_file():
            check_genai_config(json.loads(config.read_text("utf-8")), [p.split(":", 1)[1] for p in target.providers])
    except (ConfigRefused, ValueError) as err:
        raise ConversionError(f"devices would refuse this bundle's runtime configuration: {err}") from err


def write_generative_bundle(request: ConvertRequest, inputs: BundleInputs, staging: Path) -> tuple[Path, Manifest]:
    chosen, source = inputs.chosen, inputs.source
    folder = chosen.artifact.folder
    assert folder is not None and chosen.scores is not None
    check_runtime_configuration(folder, chosen.spec.runtime_config, inputs.target)
    staging.mkdir(parents=True)
    golden_path = staging / GOLDEN
    inputs.golden.write(golden_path)
    sources = {f"{MODEL_DIR}/{p.name}": p for p in sorted(folder.iterdir()) if p.is_file()}
    sources[GOLDEN] = golden_path
    digest = hashlib.sha256(b"".join(sha256_file(p).encode() for _, p in sorted(sources.items()))).hexdigest()
    profile, spec = inputs.profile, chosen.spec
    scores, times = chosen.scores, chosen.times
    machine = f"{platform.machine()} {platform.processor() or platform.system()}".strip()
    quality = GenerativeQuality(
        perplexity=scores.perplexity, reference_perplexity=inputs.reference.perplexity,
        max_perplexity_ratio=inputs.bars.max_perplexity_ratio, next_token_agreement=scores.agreement,
        min_next_token_agreement=inputs.bars.min_next_token_agreement, tokens=scores.tokens,
    )  # fmt: skip
    token_latency = (
        TokenLatency(
            ttft_ms=times.ttft_ms,
            tpot_ms=times.tpot_ms,
            prompt_tokens=inputs.prompt_tokens,
            output_tokens=inputs.output_tokens,
            runtime=spec.runtime,
            provider=spec.provider,
            threads=inputs.threads,
            machine=machine,
        )
        if times
        else None
    )
    context = source.context_length
    generation = GenerationSpec(
        model_dir=MODEL_DIR, runtime=spec.runtime,
        tokenizer_files=sorted(f"{MODEL_DIR}/{p.name}" for p in folder.iterdir() if _is_tokenizer(p.name)),
        eos_token_ids=list(source.eos_token_ids), vocab_size=source.vocab_size, context_length=context,
        max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, max(1, context // 2)), runtime_config=dict(spec.runtime_config),
        golden=GOLDEN, quality=quality, token_latency=token_latency, limit=chosen.limit,
    )  # fmt: skip
    judged = [r for r in inputs.judged if r.scores is not None]
    manifest = Manifest(
        bundle_id=f"{request.name}-{request.version}-{profile.name}-{digest[:8]}",
        model_name=request.name,
        model_version=request.version,
        profile=profile.name,
        format=inputs.target.format,
        model_path=f"{MODEL_DIR}/{ENTRY[spec.runtime]}",
        recipe=Recipe(name=spec.name, precision=spec.precision, runtime=spec.runtime, passes=chosen.artifact.passes),
        providers=list(inputs.target.providers),
        opset=_opset(folder, spec.runtime),
        inputs=[TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", "sequence", source.vocab_size])],
        files=describe_files(sources),
        accuracy=AccuracyReport(
            metric="next-token-agreement",
            value=scores.agreement,
            reference=1.0,
            budget=round(1.0 - inputs.bars.min_next_token_agreement, 6),
            samples=scores.tokens,
            passed=True,
            judged_on=f"{scores.tokens} held-out tokens, teacher-forced",
        ),
        latency=LatencyReport(
            median_ms=times.tpot_ms,
            p90_ms=times.tpot_p90_ms,
            runtime=spec.runtime,
            provider=spec.provider,
            threads=inputs.threads,
            machine=machine,
        )
        if times
        else None,
        golden=GoldenSpec(
            path=GOLDEN,
            count=len(inputs.golden.prompts),
            max_abs_error=0.0,
            min_agreement=inputs.golden.min_next_token_agreement,
        ),
        source_sha256=source.sha256,
        search=SearchReport(
            metric="next-token-agreement",
            description=f"perplexity ≤ {inputs.bars.max_perplexity_ratio:g}x FP32's and next-token agreement ≥ "
            f"{inputs.bars.min_next_token_agreement:g} on held-out text; the fastest by TPOT at batch 1",
            bar=inputs.bars.min_next_token_agreement,
            scores={r.name: round(r.scores.agreement, 6) for r in judged if r.scores},
            latency_ms={r.name: round(r.times.tpot_ms, 6) for r in judged if r.times},
            threads=[inputs.threads],
        ),
        generation=generation,
        resources=_resources(folder, spec.runtime, spec.provider, inputs.threads) if times else None,
    )
    out_path = request.out / f"{request.name}-{request.version}-{profile.name}.bundle"
    pack_bundle(out_path, manifest, sources, request.key)
    return out_path, manifest


def _resources(folder: Path, runtime: str, provider: str, threads: int) -> ResourceNeeds | None:
    """The language model's peak memory on the runtime it was timed on: loaded from its folder in a fresh process,
    generating (converter/resources.py); FLOPs are not counted for a generative bundle."""
    figure = measure_memory(folder, runtime, provider, {}, threads)
    if figure.peak_mb is None:
        log.info("%s: peak memory not measured: %s", runtime, figure.reason)
    return resource_needs([figure], None)


def _is_tokenizer(name: str) -> bool:
    return name.startswith(("tokenizer", "special_tokens_map", "openvino_tokenizer", "openvino_detokenizer"))


def _opset(folder: Path, runtime: str) -> dict[str, int]:
    if runtime != "onnxruntime-genai":
        return {}
    import json

    import onnx

    from edgefleet.converter.onnx_graph import opset_of

    config = json.loads((folder / "genai_config.json").read_text("utf-8"))
    return opset_of(onnx.load(str(folder / config["model"]["decoder"]["filename"]), load_external_data=False))
