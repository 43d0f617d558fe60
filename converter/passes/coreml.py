"""CoreML export: ONNX → onnx2torch → torch.jit.trace → coremltools ML Program (`.mlpackage`), and the torch
model that stands in for CoreML where it cannot predict (anywhere but macOS).

coremltools 9 has no ONNX front end, so the prepared ONNX graph becomes a torch module (onnx2torch), which
coremltools converts like any traced model. Precisions: `fp16` (FLOAT16 compute, what the GPU and Neural
Engine run), `fp32`, and `int8-weights` (FP16 compute plus coremltools.optimize linear weight quantization:
per-channel symmetric int8 weights, for tensors of at least `weight_threshold` elements, as coremltools does).

On Linux, `torch_runner` runs the same torch module with the recipe emulated (module and inputs in float16;
int8 weights rounded the way coremltools rounds them), so the accuracy gate sees what CoreML will compute up to
kernel differences, which the golden set's FP16 tolerance covers.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import logging
import platform
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import ConversionError

log = logging.getLogger(__name__)

CoreMLPrecision = Literal["fp32", "fp16", "int8-weights"]
PACKAGES = {"torch": "torch==2.13.0", "onnx2torch": "onnx2torch (pip install --no-deps)", "coremltools": "coremltools"}
_COREML_DTYPES = ("float32", "float16", "int32")


@dataclass(frozen=True)
class CoreMLConfig:
    precision: CoreMLPrecision = "fp16"
    minimum_deployment_target: str = "macOS13"  # ML Programs need macOS 12+; 13 adds the FP16 I/O types
    weight_threshold: int = 2048  # coremltools' default: smaller weight tensors stay in float

    def params(self) -> dict[str, str | int | float | bool | list[str] | None]:
        return {
            "convert_to": "mlprogram",
            "compute_precision": "float32" if self.precision == "fp32" else "float16",
            "weights": "int8 linear symmetric, per channel" if self.precision == "int8-weights" else "float",
            "minimum_deployment_target": self.minimum_deployment_target,
            "weight_threshold": self.weight_threshold,
        }


def missing_packages() -> str | None:
    """Why CoreML bundles cannot be built here (None when they can); imports nothing."""
    lacking = [hint for name, hint in PACKAGES.items() if importlib.util.find_spec(name) is None]
    if lacking:
        return f"CoreML bundles need {', '.join(lacking)} on the build host"
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """coremltools logs version warnings and draws progress bars on stderr; `--json` callers want neither."""
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def coremltools() -> Any:
    with _quiet():
        import coremltools as ct
    return ct


def _onnx2torch() -> Any:
    """onnx2torch imports torchvision for its NMS/RoiAlign converters only. Where no torchvision matches the
    installed torch (a CPU torch beside PyPI's CUDA torchvision), a stand-in lets the other converters load;
    a model that needs NMS or RoiAlign then fails with a clear error."""
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # ImportError, or a RuntimeError from an ABI mismatch
        log.info("torchvision unusable (%s): onnx2torch loads without its NMS/RoiAlign converters", err)
        stub, ops = types.ModuleType("torchvision"), types.ModuleType("torchvision.ops")

        def unavailable(*_args: object, **_kwargs: object) -> None:
            raise NotImplementedError("NonMaxSuppression/RoiAlign need torchvision matching the installed torch")

        ops.nms = ops.roi_align = ops.box_convert = ops.batched_nms = unavailable  # type: ignore[attr-defined]
        stub.ops = ops  # type: ignore[attr-defined]
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = stub, ops
    import onnx2torch

    return onnx2torch


def to_torch(model: onnx.ModelProto) -> Any:
    """The ONNX graph as a torch module in eval mode; ConversionError names the operators onnx2torch lacks."""
    converter = _onnx2torch()
    try:
        module = converter.convert(model)
    except NotImplementedError as err:
        raise ConversionError(f"onnx2torch cannot convert the model: {str(err).splitlines()[0][:300]}") from err
    except Exception as err:  # onnx2torch raises assorted errors on graphs it cannot map
        raise ConversionError(f"onnx2torch failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}") from err
    return module.eval()


def load_torch_model(path: Path) -> Any:
    """The user's own torch model, when they have one: a torch.export archive (.pt2, preferred: recent torch
    deprecates TorchScript) or TorchScript (.pt). It must take the ONNX model's inputs, in order, and give its
    outputs; it replaces onnx2torch's module and is checked against ONNX Runtime on the evaluation set."""
    import torch

    try:
        if path.suffix == ".pt2":
            return torch.export.load(str(path)).module()
        return torch.jit.load(str(path), map_location="cpu").eval()
    except FileNotFoundError as err:
        raise ConversionError(f"torch model {path} not found") from err
    except Exception as err:  # torch raises RuntimeError/ValueError on files it cannot read
        raise ConversionError(f"{path} is not a TorchScript (.pt) or torch.export (.pt2) model: {err}") from err


def _example(inputs: list[TensorSpec], sample: dict[str, np.ndarray]) -> tuple[Any, ...]:
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(sample[spec.name])) for spec in inputs)


def export_mlpackage(
    module: Any, inputs: list[TensorSpec], outputs: list[str], sample: dict[str, np.ndarray], config: CoreMLConfig,
    path: Path,
) -> None:  # fmt: skip
    """Trace `module` on `sample` (fixed shapes), convert to an ML Program and save the package at `path`."""
    import torch

    wrong = [f"{s.name} ({s.dtype})" for s in inputs if s.dtype not in _COREML_DTYPES]
    if wrong:
        raise ConversionError(f"CoreML inputs must be float32, float16 or int32; the model has {wrong}")
    ct = coremltools()
    try:
        with torch.no_grad(), _quiet(), warnings.catch_warnings():
            # Tracing onnx2torch's fixed-shape Reshape converters warns that shapes become constants: they are.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings(
                "ignore", message=r".*torch\.jit\.trace.* is deprecated", category=DeprecationWarning
            )
            traced = torch.jit.trace(module, _example(inputs, sample))
            mlmodel = ct.convert(
                traced,
                inputs=[
                    ct.TensorType(name=s.name, shape=tuple(sample[s.name].shape), dtype=np.dtype(s.dtype).type)
                    for s in inputs
                ],
                outputs=[ct.TensorType(name=name) for name in outputs],
                convert_to="mlprogram",
                compute_precision=ct.precision.FLOAT32 if config.precision == "fp32" else ct.precision.FLOAT16,
                minimum_deployment_target=getattr(ct.target, config.minimum_deployment_target),
            )
            if config.precision == "int8-weights":
                from coremltools.optimize.coreml import (
                    OpLinearQuantizerConfig,
                    OptimizationConfig,
                    linear_quantize_weights,
                )

                op_config = OpLinearQuantizerConfig(
                    mode="linear_symmetric", dtype="int8", granularity="per_channel",
                    weight_threshold=config.weight_threshold,
                )  # fmt: skip
                mlmodel = linear_quantize_weights(mlmodel, OptimizationConfig(global_config=op_config))
            mlmodel.save(str(path))
    except ConversionError:
        raise
    except Exception as err:  # torch.jit and coremltools raise many error types
        raise ConversionError(f"coremltools cannot convert the model: {type(err).__name__}: {err}") from err


def check_package(path: Path, inputs: list[TensorSpec], outputs: list[str], sample: dict[str, np.ndarray]) -> None:
    """Reload the saved package (spec only: loading for prediction needs macOS) and check its signature."""
    ct = coremltools()
    try:
        with _quiet():
            spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    except Exception as err:  # a package that does not reload is broken
        raise ConversionError(f"the saved .mlpackage does not reload: {err}") from err
    got_in = {i.name: list(i.type.multiArrayType.shape) for i in spec.description.input}
    want_in = {s.name: list(sample[s.name].shape) for s in inputs}
    if got_in != want_in:
        raise ConversionError(f"the .mlpackage takes inputs {got_in}, the model {want_in}")
    got_out = [o.name for o in spec.description.output]
    if got_out != outputs:
        raise ConversionError(f"the .mlpackage gives outputs {got_out}, the model {outputs}")


def package_files(path: Path, prefix: str) -> dict[str, Path]:
    """Every file inside an .mlpackage (a directory) as bundle path → file: the manifest pins each one."""
    return {f"{prefix}/{p.relative_to(path).as_posix()}": p for p in sorted(path.rglob("*")) if p.is_file()}


def fake_quantize_weights(module: Any, threshold: int) -> Any:
    """A copy of `module` whose weight tensors hold what coremltools' int8 linear symmetric per-channel
    quantization gives back (rounded to 255 levels around zero, scale per output channel)."""
    import torch

    out = copy.deepcopy(module)
    with torch.no_grad():
        for tensor in [*out.parameters(), *out.buffers()]:
            if not tensor.is_floating_point() or tensor.ndim < 2 or tensor.numel() < threshold:
                continue
            flat = tensor.reshape(tensor.shape[0], -1)
            scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            tensor.copy_((torch.round(flat / scale).clamp(-127, 127) * scale).reshape(tensor.shape))
    return out


Runner = Any  # Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def torch_runner(module: Any, inputs: list[TensorSpec], outputs: list[str], config: CoreMLConfig) -> Runner:
    """Runs the torch module with the CoreML recipe emulated: FP16 compute (and int8 weights) or FP32."""
    import torch

    half = config.precision != "fp32"
    model = fake_quantize_weights(module, config.weight_threshold) if config.precision == "int8-weights" else module
    model = copy.deepcopy(model).half() if half else model
    names = [s.name for s in inputs]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in names]
        if half:
            args = [a.half() if a.is_floating_point() else a for a in args]
        with torch.no_grad():
            result = model(*args)
        values = result if isinstance(result, tuple | list) else (result,)
        return {name: v.float().numpy() if half else v.numpy() for name, v in zip(outputs, values, strict=True)}

    return run


def coreml_runner(path: Path, outputs: list[str], compute_units: str = "ALL") -> Runner:
    """Real CoreML prediction (macOS only)."""
    if platform.system() != "Darwin":
        raise ConversionError("CoreML predicts only on macOS")
    ct = coremltools()
    model = ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, compute_units))

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = model.predict(dict(feeds))
        return {name: np.asarray(result[name], dtype=np.float32) for name in outputs}

    return run
