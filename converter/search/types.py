"""The search's vocabulary, at the bottom of the room: a prepared graph (Prepared), a recipe as the passes it runs
(Spec), what building and judging a recipe produced (Built), and which data judged it (Judgement).

Every built artifact is written under the conversion's work directory and read back from those files for
evaluation, so what is measured is exactly what would ship. Two formats cannot run here as shipped, and use the
proxy their module documents: TensorRT bundles (an engine is built on the device: the host runs an FP16 / INT8
QDQ graph of the same recipe) and CoreML packages off macOS (the onnx2torch module coremltools converted, in
torch with the recipe emulated).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from edgefleet.converter.onnx_graph import graph_inputs
from edgefleet.converter.passes import coreml as cml
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import tensorrt as trt
from edgefleet.converter.passes.nncf_accuracy import MixedNNCFConfig
from edgefleet.converter.runners import Runner, openvino_runner, ort_runner
from edgefleet.converter.search.gate import Score
from edgefleet.core.bundle.manifest import PassRecord, TensorRTOptions

# The graph a recipe starts from: the model; for one that arrives quantized, it kept as it is or its float graph
# (converter.quantized); for an encoder, its ONNX Runtime transformer fusion (converter.passes.transformer).
Source = Literal["model", "as-quantized", "dequantized", "fused"]
MODEL_DIR = "model"
COREML_PACKAGE = f"{MODEL_DIR}/model.mlpackage"

Kind = Literal[
    "ort-fp32", "ort-fp16", "ort-int8-dynamic", "ort-int8-static", "ort-int8-weights", "ov", "ov-nncf",
    "ov-nncf-accuracy", "ov-compress", "coreml", "trt",
]  # fmt: skip
Config = (
    prec.StaticConfig | prec.DynamicConfig | prec.Fp16Config | prec.WeightOnlyConfig | ovp.NNCFConfig
    | ovp.CompressConfig | cml.CoreMLConfig | trt.TensorRTConfig | MixedNNCFConfig | None
)  # fmt: skip


@dataclass
class Prepared:
    """The FP32 graph after the shared, gated graph pipeline (converter.search.prepare), or why there is none."""

    model: onnx.ModelProto | None
    passes: list[PassRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    static_from_data: bool = False
    decomposed: tuple[str, ...] = ()  # custom ops replaced by their standard-op decompositions

    @property
    def sha(self) -> str:
        assert self.model is not None
        return hashlib.sha256(self.model.SerializeToString(deterministic=True)).hexdigest()


@dataclass(frozen=True)
class Spec:
    """One recipe: the kind of pass list it runs (precision pass, export) and their configuration."""

    name: str
    kind: Kind
    precision: str
    runtime: str
    format: str
    run_on: str  # ORT provider or OpenVINO device used on this host
    config: Config = None
    hint: str | None = None  # OpenVINO inference precision hint recorded for the device
    compress_to_fp16: bool = False
    ort_format: bool = False  # onnxruntime-web: ship ONNX Runtime's ORT format
    # This host is a proxy for the target: ORT runs the quantized graph as written (Q/DQ around float ops), the
    # arithmetic the target's int8 kernels compute, not this CPU's fused int8 kernels (which saturate without
    # VNNI: a Haswell-class CPU lost 1.1 points of top-1 on the digits CNN that a VNNI CPU or TensorRT keeps).
    as_written: bool = False

    @property
    def needs_calibration(self) -> bool:
        return self.kind in ("ort-int8-static", "ov-nncf", "ov-nncf-accuracy") or (
            isinstance(self.config, trt.TensorRTConfig) and self.config.precision == "int8-static"
        )


@dataclass(frozen=True)
class Judgement:
    """Which data judged a candidate, as the report and the manifest state it (converter.search.holdout)."""

    on: Literal["selection", "held-out"]
    samples: int  # samples of the part that judged it
    reference: float  # the FP32 model's score on that part
    bar: float  # the floor on that part (a drop budget is relative to `reference`)
    selection_samples: int
    selection_score: float | None  # the score the search confirmed it with (held-out judgements)

    def describe(self) -> str:
        if self.on == "selection":
            return f"selection split ({self.samples} samples; not judged held out: it missed the bar there)"
        return (
            f"held-out split ({self.samples} samples), float layers chosen on the selection split "
            f"({self.selection_samples} samples, score {self.selection_score:.4f})"
        )


@dataclass
class Built:
    """A recipe built on a prepared graph, run on the evaluation set, scored and gated (or why it failed)."""

    spec: Spec
    prepared: Prepared
    files: dict[str, Path] = field(default_factory=dict)  # bundle-relative name → staged file
    passes: list[PassRecord] = field(default_factory=list)
    outputs: dict[str, np.ndarray] | None = None
    score: Score | None = None
    gate: str | None = None
    error: str | None = None
    cached: bool = False
    qdq_model: onnx.ModelProto | None = None  # kept for the per-layer report
    proxy: Path | None = None  # the ONNX graph this host runs in place of the artifact (TensorRT)
    tensorrt: TensorRTOptions | None = None  # what the bundle tells the device's TensorRT EP
    notes: list[str] = field(default_factory=list)
    torch_model: Path | None = None  # CoreML: the user's torch model (else onnx2torch's module of the graph)
    eval_ms: list[float] = field(default_factory=list)  # per-sample times of the accuracy evaluation
    pruned: bool = False  # stopped during evaluation: it cannot beat a candidate inside the budget
    judged: Judgement | None = None  # mixed precision: the evaluation split that judged it (None: the whole set)
    golden_refusal: str | None = None  # its golden figures would fail the rollout's default guardrail (golden_gate)

    @property
    def passed(self) -> bool:
        """Built, run and inside the accuracy budget."""
        return self.error is None and self.gate is None

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())

    @property
    def model_rel(self) -> str:
        """The artifact the runtime loads, as a bundle path (an .mlpackage is a directory)."""
        if self.spec.kind == "coreml":
            return COREML_PACKAGE
        return next(n for n in self.files if n.endswith((".onnx", ".xml", ".ort")) and n.startswith(MODEL_DIR))

    @property
    def model_file(self) -> Path:
        if self.spec.kind == "coreml":
            anchor = self.files[f"{COREML_PACKAGE}/Manifest.json"]
            return anchor.parent
        return self.files[self.model_rel]

    def runner(self, threads: int, output_names: list[str]) -> Runner:
        if self.spec.format == "openvino-ir":
            import openvino as ov

            artifact = ovp.OpenVINOArtifact(
                ov.Core().read_model(str(self.model_file)), self.spec.hint, self.spec.compress_to_fp16
            )
            return openvino_runner(artifact, output_names, threads, self.spec.run_on)
        if self.spec.kind == "coreml":
            assert isinstance(self.spec.config, cml.CoreMLConfig) and self.prepared.model is not None
            if self.spec.run_on.startswith("coreml:"):
                return cml.coreml_runner(self.model_file, output_names, self.spec.run_on.removeprefix("coreml:"))
            module = cml.load_torch_model(self.torch_model) if self.torch_model else cml.to_torch(self.prepared.model)
            return cml.torch_runner(module, graph_inputs(self.prepared.model), output_names, self.spec.config)
        return ort_runner(self.proxy or self.model_file, threads, self.spec.run_on, as_written=self.spec.as_written)
