"""OpenVINO passes: ONNX → OpenVINO IR (with the inference precision hint recorded), and NNCF INT8.

openvino and nncf are imported inside the functions so that listing passes never needs them.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx

from edgefleet.converter import deadline
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset

if TYPE_CHECKING:
    import openvino as ov

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenVINOConfig:
    inference_precision_hint: Literal["f32", "f16", "bf16"] | None = "f32"
    compress_to_fp16: bool = False


@dataclass(frozen=True)
class OpenVINOArtifact:
    """An OpenVINO model plus what the device must apply when it compiles it."""

    model: ov.Model
    inference_precision_hint: str | None
    compress_to_fp16: bool

    def save(self, xml: Path) -> list[Path]:
        import openvino as ov

        ov.save_model(self.model, str(xml), compress_to_fp16=self.compress_to_fp16)
        return [xml, xml.with_suffix(".bin")]


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    # The ONNX front end's report lists failed operators after a generic header: keep those lines.
    failed = [line.strip(" -") for line in lines if "Conversion failed for" in line or line.startswith("-- ")]
    if failed:
        return "; ".join(dict.fromkeys(failed))[:400]
    return lines[0][:300] if lines else type(err).__name__


def export_openvino(model: onnx.ModelProto, config: OpenVINOConfig = OpenVINOConfig()) -> OpenVINOArtifact:
    """Convert ONNX to an OpenVINO model (ov.convert_model reads the serialized ONNX)."""
    import openvino as ov

    try:
        converted = ov.convert_model(_as_stream(model))
    except Exception as err:  # OpenVINO raises OpConversionFailure / RuntimeError with a long report
        raise ConversionError(f"OpenVINO cannot convert the model: {_first_line(err)}") from err
    return OpenVINOArtifact(converted, config.inference_precision_hint, config.compress_to_fp16)


def _as_stream(model: onnx.ModelProto) -> Any:
    return io.BytesIO(model.SerializeToString())


@dataclass(frozen=True)
class NNCFConfig:
    preset: Literal["performance", "mixed"] = "performance"
    ignored_nodes: tuple[str, ...] = ()
    subset_size: int = 300
    fast_bias_correction: bool = True
    model_type: Literal["transformer"] | None = None  # NNCF's transformer scheme: SmoothQuant, float softmax/norms
    smooth_quant_alpha: float | None = None  # the MatMul SmoothQuant alpha (None: NNCF's default for the type)

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {
            "preset": self.preset,
            "ignored_nodes": list(self.ignored_nodes),
            "subset_size": self.subset_size,
            "fast_bias_correction": self.fast_bias_correction,
        } | ({"model_type": self.model_type, "smooth_quant_alpha": self.smooth_quant_alpha} if self.model_type else {})


@dataclass(frozen=True)
class CompressConfig:
    """NNCF weight compression (weight-only): int8_asym per channel, or int4 in groups along K."""

    mode: Literal["int8_asym", "int8_sym", "int4_sym", "int4_asym"] = "int8_asym"
    group_size: int | None = None  # int4: values per scale (NNCF's default 128)

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {"mode": self.mode, "group_size": self.group_size}


def compress_weights(artifact: OpenVINOArtifact, config: CompressConfig) -> OpenVINOArtifact:
    """NNCF's weight-only compression of the matrix products (the model passed in is cloned, never changed)."""
    import nncf

    nncf.set_log_level(logging.ERROR)
    kwargs: dict[str, Any] = {"mode": nncf.CompressWeightsMode(config.mode)}
    if config.mode.startswith("int4"):
        kwargs |= {"group_size": config.group_size or 128, "ratio": 1.0, "all_layers": True}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            compressed = nncf.compress_weights(artifact.model.clone(), **kwargs)
    except Exception as err:  # NNCF raises its own errors and whatever OpenVINO raises
        raise ConversionError(f"NNCF weight compression failed: {_first_line(err)}") from err
    return OpenVINOArtifact(compressed, artifact.inference_precision_hint, False)


def _transformer(config: NNCFConfig) -> dict[str, Any]:
    if config.model_type != "transformer":
        return {}
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    found: dict[str, Any] = {"model_type": nncf.ModelType.TRANSFORMER}
    if config.smooth_quant_alpha is not None:
        alphas = AdvancedSmoothQuantParameters(matmul=config.smooth_quant_alpha)
        found["advanced_parameters"] = AdvancedQuantizationParameters(smooth_quant_alphas=alphas)
    return found


def checked(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """NNCF's dataset transform: each sample it draws (statistics, bias correction, SmoothQuant) first checks the
    conversion's deadline (converter.deadline)."""
    deadline.check()
    return sample


def quantize_nncf(artifact: OpenVINOArtifact, config: NNCFConfig, calibration: Dataset) -> OpenVINOArtifact:
    """NNCF post-training INT8 on the OpenVINO model (the model passed in is cloned, never changed)."""
    import nncf

    names = {op.get_friendly_name() for op in artifact.model.get_ops()}
    ignored = [n for n in config.ignored_nodes if n in names]
    preset = nncf.QuantizationPreset.MIXED if config.preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE
    samples = [
        {k: np.asarray(v) for k, v in calibration.sample(i).items()}
        for i in range(min(config.subset_size, len(calibration)))
    ]
    nncf.set_log_level(logging.ERROR)
    try:
        # NNCF draws progress bars on stdout, which would corrupt `--json` output: send them elsewhere.
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(
                artifact.model.clone(),
                nncf.Dataset(samples, checked),
                preset=preset,
                subset_size=len(samples),
                fast_bias_correction=config.fast_bias_correction,
                ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
                **_transformer(config),
            )
    except deadline.TimeBudgetSpent:
        raise
    except Exception as err:  # NNCF raises its own errors and whatever OpenVINO raises
        raise ConversionError(f"NNCF INT8 quantization failed: {_first_line(err)}") from err
    return OpenVINOArtifact(quantized, artifact.inference_precision_hint, False)
