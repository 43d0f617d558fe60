"""Precision recipes on ONNX Runtime. INT8 static QDQ with U8S8 (the layout ORT's x86 kernels fuse),
per-channel weights, MinMax calibration; `reduce_range` for CPUs without VNNI."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

log = logging.getLogger(__name__)


class _DatasetReader(CalibrationDataReader):
    def __init__(self, dataset: Dataset) -> None:
        self._samples = dataset.samples()

    def get_next(self) -> dict | None:
        return next(self._samples, None)


def quantize_int8_static(source: Path, out: Path, calibration: Dataset, *, reduce_range: bool) -> Path:
    """Write a QDQ INT8 model calibrated on `calibration`. The source file is not modified."""
    with tempfile.TemporaryDirectory(prefix="edgefleet-q-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=False)
            quantize_static(
                str(prepared),
                str(out),
                _DatasetReader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                reduce_range=reduce_range,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={"CalibTensorRangeSymmetric": False},
            )
        except Exception as err:  # the quantizer raises a mix of ValueError, RuntimeError and ORT errors
            raise ConversionError(f"INT8 static quantization failed: {err}") from err
    return out
