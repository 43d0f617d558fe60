"""The bundle manifest: what a bundle holds, how it was built and how well it did. Signed as-is."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

MANIFEST_SCHEMA_VERSION = 1
_VERSION = re.compile(r"^\d+(\.\d+){0,3}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

BundleFormat = Literal["onnx", "openvino-ir", "coreml", "onnx-tensorrt"]
Precision = Literal["fp32", "fp16", "int8-dynamic", "int8-static", "int8-weights"]
Metric = Literal["top1", "argmax-agreement", "sqnr-db"]


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


class LatencyReport(Frozen):
    median_ms: float
    p90_ms: float
    runtime: str
    provider: str
    threads: int
    machine: str = Field(description="where it was measured")


class GoldenSpec(Frozen):
    path: str = "golden.npz"
    count: int = Field(ge=1)
    max_abs_error: float = Field(description="allowed |device - expected| against the build's own outputs")
    min_agreement: float = Field(
        ge=0, le=1, description="share of golden inputs whose argmax must equal the FP32 reference's"
    )


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


_OPTIONAL_BLOCKS = ("custom_ops", "tensorrt", "web")


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
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    min_agent_version: str = "0.1.0"
    tensorrt: TensorRTOptions | None = Field(default=None, description="onnx-tensorrt bundles: the TensorRT EP options")
    web: WebOptions | None = Field(default=None, description="browser bundles: what the onnxruntime-web page needs")

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The optional blocks are left out when unused, so agents that predate them still parse such bundles."""
        data: dict[str, object] = handler(self)
        for key in _OPTIONAL_BLOCKS:
            if key in data and not data[key]:
                del data[key]
        return data

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
    def version_key(self) -> tuple[int, ...]:
        return parse_version(self.model_version)

    def file(self, path: str) -> FileEntry:
        for entry in self.files:
            if entry.path == path:
                return entry
        raise KeyError(path)
