"""Precision passes on ONNX: FP16, INT8 dynamic, INT8 static QDQ, and the per-layer loss report that
names which layers to keep in float when a quantized model misses its budget. Pure: model in, new model out."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from edgefleet.converter import deadline
from edgefleet.converter.onnx_graph import graph_nodes
from edgefleet.converter.passes.graph import copy_model, default_opset
from edgefleet.converter.scratch import scratch_cwd
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

log = logging.getLogger(__name__)

QUANTIZABLE_MATMUL = ("MatMul", "Gemm", "LSTM", "GRU", "Attention")
CalibrationName = Literal["minmax", "percentile", "entropy"]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _require_default_opset(model: onnx.ModelProto, what: str) -> None:
    if not default_opset(model):
        raise ConversionError(
            f"{what} needs a default-domain opset import (ONNX Runtime's quantizer refuses models without one, "
            "as skl2onnx writes for pure ai.onnx.ml graphs)"
        )


# --- FP16 ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp16Config:
    keep_io_types: bool = True
    op_block_list: tuple[str, ...] = ()  # added to onnxruntime's default block list
    node_block_list: tuple[str, ...] = ()


def to_fp16(model: onnx.ModelProto, config: Fp16Config = Fp16Config()) -> onnx.ModelProto:
    """Float tensors to float16; inputs and outputs stay float32 so callers feed the same data."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    # Custom operators keep float32: their implementations declare the element types they take.
    custom = sorted({n.op_type for n in graph_nodes(model.graph) if n.domain not in ("", "ai.onnx", "ai.onnx.ml")})
    try:
        return convert_float_to_float16(
            copy_model(model),
            keep_io_types=config.keep_io_types,
            op_block_list=[*DEFAULT_OP_BLOCK_LIST, *config.op_block_list, *custom],
            node_block_list=list(config.node_block_list) or None,
        )
    except Exception as err:  # the converter raises ValueError / onnx errors
        raise ConversionError(f"FP16 conversion failed: {_first_line(err)}") from err


# --- INT8 dynamic ---------------------------------------------------------------------------------------------


def matmul_weight_share(model: onnx.ModelProto) -> float:
    """Share of weight parameters held by MatMul/Gemm/RNN nodes (0..1): what dynamic INT8 can speed up."""
    sizes = {init.name: int(np.prod(init.dims)) for init in model.graph.initializer if len(init.dims) >= 2}
    total = sum(sizes.values())
    if not total:
        return 0.0
    matmul = sum(
        sizes.get(name, 0) for node in graph_nodes(model.graph) if node.op_type in QUANTIZABLE_MATMUL
        for name in node.input
    )  # fmt: skip
    return matmul / total


@dataclass(frozen=True)
class DynamicConfig:
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    per_channel: bool = False
    reduce_range: bool = False
    min_matmul_share: float = 0.5
    # ORT-fused graphs (Attention, SkipLayerNormalization, ...) have outputs ONNX shape inference cannot type: the
    # quantizer then fails ("Unable to find data type for weight_name") unless told to take them as float
    default_float: bool = False


def dynamic_unsuitability(model: onnx.ModelProto, config: DynamicConfig = DynamicConfig()) -> str | None:
    """Why dynamic INT8 does not suit this graph (None when it does). Convolutions are never quantized
    dynamically: ConvInteger is far slower than FP32 on CPUs."""
    share = matmul_weight_share(model)
    if share < config.min_matmul_share:
        return (
            f"not suited: MatMul/Gemm/RNN hold {share:.0%} of the weights (< {config.min_matmul_share:.0%}); "
            "dynamic INT8 only pays off on MatMul-heavy graphs"
        )
    return None


def quantize_int8_dynamic(model: onnx.ModelProto, config: DynamicConfig = DynamicConfig()) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _require_default_opset(model, "INT8 dynamic quantization")
    with tempfile.TemporaryDirectory(prefix="edgefleet-dyn-") as tmp:
        out = Path(tmp) / "dyn.onnx"
        try:
            quantize_dynamic(
                copy_model(model),
                str(out),
                op_types_to_quantize=list(config.op_types),
                per_channel=config.per_channel,
                reduce_range=config.reduce_range,
                weight_type=QuantType.QInt8,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT} if config.default_float else {},
            )
        except Exception as err:  # the quantizer raises a mix of ValueError, RuntimeError and ORT errors
            raise ConversionError(f"INT8 dynamic quantization failed: {_first_line(err)}") from err
        return onnx.load(str(out))


# --- weight-only INT8 / INT4 matrix products (MatMulNBits) -----------------------------------------------------


@dataclass(frozen=True)
class WeightOnlyConfig:
    """MatMul weights stored in `bits` per value, blocks of `block_size` along K with their own scale, in
    com.microsoft's MatMulNBits; `accuracy_level` 4 lets its kernel compute in INT8 (activations quantized per
    block on the fly), None computes in float."""

    bits: Literal[4, 8] = 4
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int | None = 4

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {"bits": self.bits, "block_size": self.block_size, "symmetric": self.symmetric,
                "accuracy_level": self.accuracy_level}  # fmt: skip


def quantize_weights(model: onnx.ModelProto, config: WeightOnlyConfig = WeightOnlyConfig()) -> onnx.ModelProto:
    """Weight-only quantization of the MatMuls with constant weights (onnxruntime's MatMulNBitsQuantizer)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    try:
        quantizer = MatMulNBitsQuantizer(
            copy_model(model), bits=config.bits, block_size=config.block_size, is_symmetric=config.symmetric,
            accuracy_level=config.accuracy_level,
        )  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            quantizer.process()
        out = quantizer.model.model
    except Exception as err:  # the quantizer raises what its graph walk meets
        raise ConversionError(f"weight-only INT{config.bits} quantization failed: {_first_line(err)}") from err
    if not any(n.op_type == "MatMulNBits" for n in out.graph.node):
        raise ConversionError("not suited: no MatMul with a constant weight to quantize weight-only")
    return out


# --- INT8 static QDQ ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticConfig:
    """INT8 static QDQ. U8S8 (uint8 activations) is what x86 VNNI kernels fuse; S8S8 suits ARM; reduce_range
    (7-bit) avoids saturation on x86 CPUs without VNNI."""

    activations: Literal["uint8", "int8"] = "uint8"
    per_channel: bool = True
    reduce_range: bool = False
    calibration: CalibrationName = "minmax"
    percentile: float = 99.999
    entropy_bins: int = 2048  # onnxruntime's default 128 leaves Entropy a single threshold = MinMax
    exclude_nodes: tuple[str, ...] = ()
    exclude_op_types: tuple[str, ...] = ()
    max_samples: int = 256
    symmetric_activations: bool = False  # zero-point-free activation ranges (what TensorRT's INT8 computes)

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {
            "activations": self.activations,
            "weights": "int8",
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "calibration": self.calibration,
            "excluded_nodes": list(self.exclude_nodes),
        }


class _Reader:
    """onnxruntime CalibrationDataReader over a Dataset (duck-typed: get_next, rewind, iteration)."""

    def __init__(self, dataset: Dataset, limit: int) -> None:
        self._dataset, self._limit = dataset, limit
        self._iter = self._make()

    def _make(self) -> Iterator[dict[str, np.ndarray]]:
        for index in range(min(self._limit, len(self._dataset))):
            deadline.check()
            yield {k: np.asarray(v) for k, v in self._dataset.sample(index).items()}

    def get_next(self) -> dict[str, np.ndarray] | None:  # numpy scalars (0-d samples) become arrays for ORT
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = self._make()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self._make()

    def __len__(self) -> int:
        return min(self._limit, len(self._dataset))


def prepare_for_quantization(model: onnx.ModelProto, work: Path) -> Path:
    """onnxruntime's quant_pre_process (shape inference + its own cleanup) into a file, as the quantizer wants."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, prepared = (work / "float.onnx").resolve(), (work / "prepared.onnx").resolve()
    onnx.save(model, str(source))
    with scratch_cwd():
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=False)
        except Exception as err:  # symbolic inference fails on some graphs: retry without it
            log.info("quant_pre_process with symbolic shapes failed (%s); retrying without", err)
            try:
                quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            except Exception as err2:
                raise ConversionError(f"preparing for quantization failed: {_first_line(err2)}") from err2
    return prepared


QDQ_MIN_OPSET = 13  # older DequantizeLinear cannot take the int32 biases ORT's QDQ quantizer writes


def _at_least_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    from edgefleet.converter.passes.graph import OpsetConfig, convert_opset, default_opset

    return convert_opset(model, OpsetConfig(opset)) if 0 < default_opset(model) < opset else model


def quantize_int8_static(
    model: onnx.ModelProto, config: StaticConfig, calibration: Dataset, statistics: Path | None = None
) -> onnx.ModelProto:
    """INT8 static QDQ by onnxruntime's quantizer. `statistics`: a directory where the calibration's tensor ranges
    are kept and shared (onnxruntime's calibration cache, one file per graph, data and calibration settings): the
    variants that differ only in what they keep in float, or in their activation and weight types, calibrate once."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    _require_default_opset(model, "INT8 static quantization")
    model = _at_least_opset(model, QDQ_MIN_OPSET)
    method = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }[config.calibration]
    extra: dict[str, object] = {"CalibTensorRangeSymmetric": False, "ActivationSymmetric": config.symmetric_activations}
    if config.calibration == "percentile":
        extra["CalibPercentile"] = config.percentile
    if config.calibration == "entropy":
        extra.update({"CalibNumBins": config.entropy_bins, "CalibNumQuantizedBins": 128})
    excluded = list(config.exclude_nodes) + [
        n.name for n in model.graph.node if n.op_type in config.exclude_op_types and n.name
    ]
    with tempfile.TemporaryDirectory(prefix="edgefleet-q-") as tmp:
        work = Path(tmp)
        prepared = prepare_for_quantization(model, work)
        out = work / "qdq.onnx"
        cache = statistics / f"{_statistics_key(prepared, calibration, config, extra)}.json" if statistics else None
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            # The calibrators print progress on stdout, which would corrupt `--json` output.
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_static(
                    str(prepared),
                    str(out),
                    _Reader(calibration, config.max_samples),
                    quant_format=QuantFormat.QDQ,
                    per_channel=config.per_channel,
                    reduce_range=config.reduce_range,
                    activation_type=QuantType.QUInt8 if config.activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=method,
                    nodes_to_exclude=excluded,
                    extra_options=extra,
                    calibration_cache_path=cache,
                )
        except deadline.TimeBudgetSpent:
            raise
        except Exception as err:  # the quantizer raises a mix of ValueError, RuntimeError and ORT errors
            raise ConversionError(f"INT8 static quantization failed: {_first_line(err)}") from err
        return onnx.load(str(out))


def _statistics_key(prepared: Path, calibration: Dataset, config: StaticConfig, extra: dict[str, object]) -> str:
    """What the tensor ranges depend on: the graph as the calibrator sees it, the samples it reads, the method and
    its settings (never the nodes kept in float, nor the quantized types: those are applied after)."""
    digest = hashlib.sha256(prepared.read_bytes())
    count = min(config.max_samples, len(calibration))
    for index in range(count):
        for name, value in sorted(calibration.sample(index).items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    calib_options = {k: v for k, v in extra.items() if k.startswith("Calib")}
    digest.update(repr((config.calibration, count, sorted(calib_options.items()))).encode())
    return digest.hexdigest()[:32]


# --- per-layer loss report (qdq_loss_debug) -----------------------------------------------------------------


@dataclass(frozen=True)
class LayerLoss:
    tensor: str
    node: str
    op_type: str
    sqnr_db: float


@dataclass(frozen=True)
class LayerReport:
    layers: list[LayerLoss] = field(default_factory=list)

    def worst(self, count: int) -> list[LayerLoss]:
        return sorted(self.layers, key=lambda layer: layer.sqnr_db)[:count]


def layer_report(
    float_model: onnx.ModelProto, qdq_model: onnx.ModelProto, data: Dataset, samples: int = 32
) -> LayerReport:
    """SQNR of every quantized activation against the float model's (onnxruntime.quantization.qdq_loss_debug),
    each mapped to the node that produces it."""
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    float_model = _at_least_opset(float_model, QDQ_MIN_OPSET)  # as quantize_int8_static saw it: same node names
    with tempfile.TemporaryDirectory(prefix="edgefleet-dbg-") as tmp:
        work = Path(tmp)
        prepared = prepare_for_quantization(float_model, work)
        qdq_path, float_aug, qdq_aug = work / "qdq.onnx", work / "float-aug.onnx", work / "qdq-aug.onnx"
        onnx.save(qdq_model, str(qdq_path))
        try:
            modify_model_output_intermediate_tensors(str(prepared), str(float_aug))
            modify_model_output_intermediate_tensors(str(qdq_path), str(qdq_aug))
            float_acts = collect_activations(str(float_aug), _Reader(data, samples))
            qdq_acts = collect_activations(str(qdq_aug), _Reader(data, samples))
            errors = compute_activation_error(create_activation_matching(qdq_acts, float_acts))
        except Exception as err:  # the debug helpers raise whatever their sessions raise
            raise ConversionError(f"per-layer quantization report failed: {_first_line(err)}") from err
        producers = {o: n for n in onnx.load(str(prepared)).graph.node for o in n.output}
    layers = []
    for tensor, loss in errors.items():
        node = producers.get(tensor)
        value = loss.get("xmodel_err")
        if node is None or value is None or not np.isfinite(value):
            continue
        layers.append(LayerLoss(tensor, node.name, node.op_type, float(value)))
    return LayerReport(layers)
