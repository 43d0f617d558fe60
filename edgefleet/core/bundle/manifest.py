"""The bundle manifest: what a bundle holds, how it was built and how well it did. Signed as-is."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from edgefleet.core.bundle.generation import GenerationSpec
from edgefleet.core.messages import OutputRule

MANIFEST_SCHEMA_VERSION = 1
_VERSION = re.compile(r"^\d+(\.\d+){0,3}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

BundleFormat = Literal["onnx", "openvino-ir", "coreml", "onnx-tensorrt", "onnx-genai", "openvino-genai"]
GENERATIVE_FORMATS = ("onnx-genai", "openvino-genai")  # a folder a generation runtime loads (bundle/generation.py)
Precision = Literal["fp32", "fp16", "bf16", "int8-dynamic", "int8-static", "int8-weights", "int4-weights"]
# top1, argmax-agreement, sqnr-db by default; any task metric of edgefleet.converter.metrics or a user's file.py:fn
Metric = str


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def parse_version(version: str) -> tuple[int, ...]:
    """Model versions are dotted integers ("3", "1.2.0") so that "only goes up" is well defined."""
    if not _VERSION.match(version):
        raise ValueError(f"invalid model version {version!r}: use dotted integers such as 1 or 1.2.0")
    return tuple(int(part) for part in version.split("."))


class TensorSpec(Frozen):
    name: str
    dtype: str = Field(description="numpy dtype name, e.g. float32, int64")
    shape: list[int | str | None] = Field(description="dimensions; strings are symbolic, None unknown")
    non_finite: bool = Field(
        default=False,
        description="an input that takes NaN or Infinity (e.g. missing values in a tree model); a device refuses "
        "them in any other input",
    )

    @model_serializer(mode="wrap")
    def _omit_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """`non_finite` is left out when False, so agents that predate it still parse the manifest."""
        data: dict[str, object] = handler(self)
        if not data.get("non_finite"):
            data.pop("non_finite", None)
        return data


class FileEntry(Frozen):
    path: str = Field(description="relative path inside the bundle, '/' separated")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class PassRecord(Frozen):
    name: str
    params: dict[str, str | int | float | bool | list[str] | None] = Field(default_factory=dict)


class Recipe(Frozen):
    name: str = Field(description="e.g. fp32, int8-static-qdq")
    precision: Precision
    runtime: str = Field(description="runtime the recipe was built and measured for, e.g. onnxruntime")
    passes: list[PassRecord] = Field(default_factory=list)


class AccuracyReport(Frozen):
    metric: Metric = Field(
        description="top1 (labels given), argmax-agreement with FP32 (classifiers), or sqnr-db: the lowest "
        "signal-to-quantization-noise ratio over the float outputs (reference 120 = bit-exact)"
    )
    value: float = Field(description="the bundle's score on the evaluation set")
    reference: float = Field(description="the FP32 source model's score on the same set")
    budget: float = Field(description="largest allowed drop below the reference")
    samples: int = Field(ge=1)
    passed: bool
    judged_on: str = Field(
        default="evaluation set",
        description="the data `value` was scored on: the whole evaluation set, or for mixed precision the held-out "
        "split (its float layers chosen on the selection split, which never judges)",
    )
    selection_samples: int = Field(
        default=0, ge=0, description="mixed precision: the samples its float layers were chosen on"
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Left out at their defaults, so agents that predate held-out judging still parse plain bundles."""
        data: dict[str, object] = handler(self)
        if data.get("judged_on") == "evaluation set":
            data.pop("judged_on", None)
        if not data.get("selection_samples"):
            data.pop("selection_samples", None)
        return data


class LatencyReport(Frozen):
    # Finite and not negative: the host scales and widens a device's latency limit by these (judge/latency.py), so
    # an infinite p90 would lift the limit altogether.
    median_ms: float = Field(ge=0, allow_inf_nan=False)
    p90_ms: float = Field(ge=0, allow_inf_nan=False)
    runtime: str
    provider: str
    threads: int
    machine: str = Field(description="where it was measured")


class OutputCheck(Frozen):
    """How the device judges one output on the golden set: the rule for its kind and tolerances that come from
    the built artifact's own spread against the FP32 reference (edgefleet.core.quality.output_rules)."""

    output: str
    rule: OutputRule = Field(
        description="class-agreement: per-sample argmax (or label) agreement and top-k; position-agreement: "
        "per-position argmax agreement (CTC, token logits); continuous: SQNR, cosine and max-abs error"
    )
    min_agreement: float | None = Field(default=None, ge=0, le=1, description="agreement rules: lowest share")
    top_k: int | None = Field(default=None, ge=1, description="class scores: k of the top-k check")
    min_top_k: float | None = Field(default=None, ge=0, le=1, description="share whose reference top-1 is in top-k")
    min_sqnr_db: float | None = Field(default=None, description="continuous: lowest SQNR against the FP32 reference")
    min_cosine: float | None = Field(default=None, description="continuous: lowest cosine similarity")
    max_abs_error: float | None = Field(default=None, ge=0, description="continuous: largest |device - FP32|")
    measured: dict[str, float] = Field(
        default_factory=dict, description="the artifact's own figures on the evaluation data the tolerances came from"
    )


class GoldenSpec(Frozen):
    path: str = "golden.npz"
    count: int = Field(ge=1)
    max_abs_error: float = Field(description="allowed |device - expected| against the build's own outputs")
    min_agreement: float = Field(
        ge=0,
        le=1,
        description="the golden floor a first bundle on a device is held to: the golden agreement the device reports "
        "for the build's own outputs (edgefleet.core.quality.golden.compare), less one sample",
    )
    outputs: list[OutputCheck] = Field(
        default_factory=list, description="per-output rule and tolerances; empty (older bundles): derived on device"
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Left out when empty, so agents that predate per-output checks still parse such manifests."""
        data: dict[str, object] = handler(self)
        if not data.get("outputs"):
            data.pop("outputs", None)
        return data


class GoldenHold(Frozen):
    """The golden figures the device will report for this bundle, computed at build by the device's own golden check
    (edgefleet.core.quality.golden.compare) on the bundle's outputs for its golden inputs, and the floor the
    rollout's default golden guardrail holds them to (edgefleet.core.quality.golden_hold)."""

    agreement: float = Field(
        ge=0, le=1, description="the golden agreement the device reports (telemetry golden_agreement) on this runtime"
    )
    scores: dict[str, float] = Field(
        default_factory=dict, description="per output: the golden score the device reports (agreement or cosine)"
    )
    max_drop: float = Field(ge=0, description="the rollout's default max golden drop for this bundle")
    floor: float = Field(
        description="the lowest agreement and score the default guardrail accepts when the bundle replaces the same "
        "model in FP32 (baseline 1.0): 1 - max_drop, widened by the drop the build itself plans (at most max_drop)"
    )
    passed: bool = Field(description="agreement and every score at or above the floor, and the golden check passes")
    runtime: str = Field(description="the runtime and provider the figures were computed on")
    same_runtime: bool = Field(
        default=True, description="False: this host ran a stand-in for the device's runtime (a proxy)"
    )

    def summary(self) -> str:
        """One line a user reads: the figure, the floor, and whether the rollout will pass."""
        lowest = min(self.scores.items(), key=lambda kv: kv[1], default=None)
        scores = f", lowest output score {lowest[1]:.4f} ({lowest[0]})" if lowest and lowest[1] < self.agreement else ""
        verdict = "≥" if self.passed else "<"
        where = "" if self.same_runtime else " (computed on a stand-in for the device's runtime)"
        figure = f"{self.agreement:.3f}{scores} {verdict} floor {self.floor:.3f}"
        return f"golden agreement the rollout will hold: {figure}{where}"


class ResourceNeeds(Frozen):
    """What one bundle needs of a device, measured by the converter where it built it: the runtime manager admits a
    desired set of slots against the profile's memory budget with these (issue 33, item 3)."""

    peak_memory_mb: dict[str, float] = Field(
        description="runtime/provider -> the process memory the loaded model added at its peak (load, warm-up, runs)"
    )
    flops_per_run: float | None = Field(default=None, ge=0, description="compute of one run at the golden batch")
    measured_on: str = Field(default="", description="the machine the figures were measured on")

    def peak_mb(self, runtime: str | None = None) -> float:
        """The figure for one runtime (its key, or a key starting with it), else the largest: admission over-counts
        rather than under-counts."""
        if runtime is not None:
            for key, value in self.peak_memory_mb.items():
                if key == runtime or key.startswith(runtime + "/"):
                    return value
        return max(self.peak_memory_mb.values(), default=0.0)

    def summary(self) -> str:
        """One line a user reads: peak memory per runtime/provider and one run's compute."""
        memory = ", ".join(f"{mb:.1f} MB on {key}" for key, mb in self.peak_memory_mb.items()) or "memory not measured"
        flops = "" if self.flops_per_run is None else f"; {self.flops_per_run / 1e6:,.2f} MFLOP a run"
        where = f" (measured on {self.measured_on})" if self.measured_on else ""
        return f"peak memory {memory}{flops}{where}"


class CustomOp(Frozen):
    """One operator outside the standard ONNX domains that the model still contains."""

    domain: str
    op_type: str
    version: int = Field(ge=0, description="the domain's opset version the model imports")
    library: str | None = Field(
        default=None,
        description="file name of the compiled custom-op library that implements it (the device looks it up in "
        "its custom-op directories); None: any implementation the device has",
    )

    @property
    def key(self) -> str:
        return f"{self.domain}::{self.op_type}"


class TensorRTOptions(Frozen):
    """What ONNX Runtime's TensorRT EP is told when the device builds the engine from the bundle's ONNX."""

    fp16: bool = Field(description="trt_fp16_enable")
    int8: bool = Field(description="trt_int8_enable (with the calibration table)")
    calibration_table: str | None = Field(
        default=None, description="bundle path of the INT8 calibration table (onnxruntime write_calibration_table)"
    )
    builder_optimization_level: int = Field(default=3, ge=0, le=5)


class WebOptions(Frozen):
    """How a browser page runs the bundle with onnxruntime-web."""

    golden_json: str = Field(description="bundle path of the golden set as JSON (base64 little-endian tensors)")
    ort_format: bool = Field(default=False, description="the model file is in ONNX Runtime's ORT format")
    onnxruntime_web: str = Field(description="the onnxruntime-web version its operators were checked against")


class SearchReport(Frozen):
    """How the recipe was chosen: the task metric, its bar, every candidate's score and latency, the threads."""

    metric: str
    description: str = ""
    bar: float = Field(description="the lowest score a candidate could ship with")
    min_score: float | None = Field(default=None, description="the absolute bar, when the user gave one")
    max_drop: float | None = Field(default=None, description="the largest drop below FP32, when that set the bar")
    scores: dict[str, float] = Field(default_factory=dict, description="every judged candidate's score")
    latency_ms: dict[str, float] = Field(default_factory=dict, description="every timed candidate's median")
    threads: list[int] = Field(default_factory=list, description="thread counts candidates were timed at")
    latency_by_threads: dict[str, float] = Field(
        default_factory=dict, description="the chosen recipe's median ms at each of those thread counts"
    )
    judged_on: dict[str, str] = Field(
        default_factory=dict, description="candidates not scored on the whole evaluation set: the split that did"
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Left out when empty, so agents that predate held-out judging still parse such manifests."""
        data: dict[str, object] = handler(self)
        if not data.get("judged_on"):
            data.pop("judged_on", None)
        return data


class DeviceMeasurement(Frozen):
    """One device's figures for the chosen recipe, when the fleet measured the candidates (`convert --measure-on`)."""

    device_id: str
    profile: str = Field(description="the profile the device runs")
    provider: str | None = Field(default=None, description="the provider the device would serve it with")
    threads: int = Field(default=0, description="the device's intra-op threads (0: the runtime decides)")
    cpu_share: float = Field(default=1.0, description="share of the device's cores the measuring worker had")
    measured_at: datetime
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    load_ms: float | None = None
    peak_rss_mb: float | None = None


class FarmReport(Frozen):
    """Where and when the recipe's latency was measured when devices of the profile measured the candidates."""

    statistic: str = Field(description="how the devices' figures were combined into one per candidate")
    latency_ms: dict[str, float] = Field(default_factory=dict, description="candidate -> the combined figure")
    devices: list[DeviceMeasurement] = Field(default_factory=list, description="the chosen recipe, per device")
    silent: list[str] = Field(default_factory=list, description="devices asked that did not answer in time")


_OPTIONAL_BLOCKS = (
    "custom_ops", "tensorrt", "web", "drift_reference", "class_labels", "search", "benchmark_only", "farm",
    "generation", "golden_hold", "resources",
)  # fmt: skip


class Manifest(Frozen):
    schema_version: int = MANIFEST_SCHEMA_VERSION
    bundle_id: str
    model_name: str
    model_version: str
    profile: str
    format: BundleFormat
    model_path: str = Field(description="the artifact the runtime loads, relative to the bundle root")
    recipe: Recipe
    providers: list[str] = Field(description="execution providers the bundle allows, in preference order")
    custom_op_domains: dict[str, int] = Field(default_factory=dict)
    custom_ops: list[CustomOp] = Field(default_factory=list, description="the non-standard operators it uses")
    opset: dict[str, int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    files: list[FileEntry]
    accuracy: AccuracyReport
    latency: LatencyReport | None = None
    golden: GoldenSpec
    source_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the source ONNX model")
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    min_agent_version: str = "0.1.0"
    tensorrt: TensorRTOptions | None = Field(default=None, description="onnx-tensorrt bundles: the TensorRT EP options")
    web: WebOptions | None = Field(default=None, description="browser bundles: what the onnxruntime-web page needs")
    class_labels: dict[str, list[str | int]] = Field(
        default_factory=dict, description="outputs turned from ZipMaps into probability tensors: each column's class"
    )
    search: SearchReport | None = Field(default=None, description="the task metric, bar and candidates' scores")
    drift_reference: str | None = Field(
        default=None, description="bundle path of the input/output reference statistics for drift (JSON)"
    )
    benchmark_only: bool = Field(
        default=False,
        description="a candidate sent to devices to be measured (edgefleet/core/farm_messages.py): never served, never "
        "committed; agents that predate the field refuse it (unknown field)",
    )
    farm: FarmReport | None = Field(
        default=None, description="the devices that measured the candidates (`convert --measure-on`), and when"
    )
    generation: GenerationSpec | None = Field(
        default=None, description="generative bundles: tokenizer, golden prompts, quality and token latency"
    )
    golden_hold: GoldenHold | None = Field(
        default=None, description="the golden figures the device will report, and the floor the rollout holds them to"
    )
    resources: ResourceNeeds | None = Field(
        default=None, description="measured peak memory per runtime and compute: what the device's budget admits"
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The optional blocks are left out when unused, so agents that predate them still parse such bundles."""
        data: dict[str, object] = handler(self)
        for key in _OPTIONAL_BLOCKS:
            if key in data and not data[key]:
                del data[key]
        return data

    @model_validator(mode="after")
    def _generation_matches_format(self) -> Manifest:
        if (self.format in GENERATIVE_FORMATS) != (self.generation is not None):
            raise ValueError(
                f"format {self.format!r} and the generation block disagree: a generative format "
                f"({', '.join(GENERATIVE_FORMATS)}) needs one, any other format must not have one"
            )
        return self

    @field_validator("model_name")
    @classmethod
    def _model_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("model name: 1-64 lowercase letters, digits, '.', '_' or '-'")
        return value

    @field_validator("model_version")
    @classmethod
    def _model_version(cls, value: str) -> str:
        parse_version(value)
        return value

    @property
    def generative(self) -> bool:
        return self.generation is not None

    @property
    def version_key(self) -> tuple[int, ...]:
        return parse_version(self.model_version)

    def file(self, path: str) -> FileEntry:
        for entry in self.files:
            if entry.path == path:
                return entry
        raise KeyError(path)
