"""TensorRT bundles: portable ONNX plus the TensorRT EP options; the engine is built on the device.

A TensorRT engine is tied to one GPU architecture and one TensorRT/CUDA version, so the bundle never carries
one. It carries the FP32 ONNX graph, the EP options (`trt_fp16_enable`, `trt_int8_enable`) and, for INT8, the
calibration table ONNX Runtime's TensorRT EP reads (`trt_int8_calibration_table_name`), written by
onnxruntime's `write_calibration_table` from symmetric MinMax ranges of every tensor over the calibration data.

Without the device, accuracy is checked on a CPU proxy that computes what the engine will: FP16 = the graph
converted to float16 (IO kept float32); INT8 = a QDQ graph with int8 symmetric activations from the same
calibration data (TensorRT's calibrated INT8 is symmetric per tensor for activations, per channel for weights).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx

from edgefleet.converter.onnx_graph import graph_nodes
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.tensorrt_support import SUPPORTED
from edgefleet.converter.scratch import scratch_cwd
from edgefleet.core.bundle.manifest import TensorRTOptions
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

CALIBRATION_TABLE = "calibration.flatbuffers"  # the name onnxruntime's TensorRT EP documentation uses
TrtPrecision = Literal["fp32", "fp16", "int8-static"]


@dataclass(frozen=True)
class TensorRTConfig:
    precision: TrtPrecision
    builder_optimization_level: int = 3
    max_samples: int = 256

    def options(self, calibration_table: str | None) -> TensorRTOptions:
        return TensorRTOptions(
            fp16=self.precision in ("fp16", "int8-static"),  # INT8 engines keep FP16 for layers left in float
            int8=self.precision == "int8-static",
            calibration_table=calibration_table,
            builder_optimization_level=self.builder_optimization_level,
        )

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        options = self.options(f"model/{CALIBRATION_TABLE}" if self.precision == "int8-static" else None)
        return {
            "trt_fp16_enable": options.fp16,
            "trt_int8_enable": options.int8,
            "trt_int8_calibration_table_name": CALIBRATION_TABLE if options.int8 else None,
            "trt_builder_optimization_level": options.builder_optimization_level,
            "engine": "built on the device at first load, cached by model hash + TensorRT version + GPU arch",
        }


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """Operators TensorRT's ONNX parser cannot take (they run on the CUDA/CPU EPs between engines)."""
    found = set()
    for node in graph_nodes(model.graph):
        standard = (node.domain or "") in ("", "ai.onnx")
        if not standard or node.op_type not in SUPPORTED:
            found.add(node.op_type if standard else f"{node.domain}::{node.op_type}")
    return sorted(found)


def write_calibration_table(model: onnx.ModelProto, calibration: Dataset, out_dir: Path, max_samples: int) -> Path:
    """Symmetric MinMax ranges of every tensor over the calibration data, as the TensorRT EP's table."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.quant_utils import write_calibration_table as write_table

    reader = prec._Reader(calibration, max_samples)
    with tempfile.TemporaryDirectory(prefix="edgefleet-trt-") as tmp:
        work = Path(tmp)
        # The graph exactly as shipped (no quant_pre_process): the table is keyed by the tensor names the device's
        # TensorRT EP will see.
        prepared = work / "model.onnx"
        onnx.save(model, str(prepared))
        try:
            with scratch_cwd(), contextlib.redirect_stdout(io.StringIO()):
                calibrator = create_calibrator(
                    prepared,
                    op_types_to_calibrate=None,
                    augmented_model_path=str(work / "augmented.onnx"),
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"symmetric": True},
                )
                calibrator.collect_data(reader)
                ranges = calibrator.compute_data()
        except Exception as err:  # the calibrator raises whatever its session raises
            raise ConversionError(f"INT8 calibration failed: {str(err).splitlines()[0][:300]}") from err
        out_dir.mkdir(parents=True, exist_ok=True)
        write_table(ranges, dir=str(work))
        table = out_dir / CALIBRATION_TABLE
        table.write_bytes((work / CALIBRATION_TABLE).read_bytes())
    return table


def proxy_model(model: onnx.ModelProto, config: TensorRTConfig, calibration: Dataset) -> onnx.ModelProto:
    """The graph this host runs to check accuracy in place of the engine (see the module docstring)."""
    if config.precision == "fp16":
        return prec.to_fp16(model)
    if config.precision == "int8-static":
        static = prec.StaticConfig(
            activations="int8", per_channel=True, symmetric_activations=True, max_samples=config.max_samples
        )
        return prec.quantize_int8_static(model, static, calibration)
    return model
