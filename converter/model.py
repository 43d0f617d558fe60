"""Loading an ONNX model with clear errors: the source model, its signature and opsets, and the rewrites
loading made (converter.passes.normalize)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from edgefleet.converter.large_model import check_locations
from edgefleet.converter.onnx_graph import tensor_spec
from edgefleet.converter.passes.normalize import check_size, is_large, normalize
from edgefleet.converter.quantized import Arrived, detect
from edgefleet.core.bundle.archive import sha256_file
from edgefleet.core.bundle.manifest import PassRecord, TensorSpec
from edgefleet.core.custom_ops.packages import STANDARD_DOMAINS
from edgefleet.core.errors import ModelError

__all__ = ["SourceModel", "load_model"]


@dataclass(frozen=True)
class SourceModel:
    path: Path
    proto: onnx.ModelProto
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: dict[str, int]
    passes: list[PassRecord] = field(default_factory=list)  # recorded rewrites made when loading (normalize)
    class_labels: dict[str, list[str | int]] = field(default_factory=dict)  # output → its columns' classes
    large: bool = False  # over protobuf's limit: `proto` holds the graph without its external data (large_model.py)
    quantization: Arrived | None = None  # the quantization it arrives with (converter.quantized); None: float

    @property
    def runnable(self) -> Path | onnx.ModelProto:
        """What a runtime should load to run the source as the converter sees it (rewritten or the file)."""
        return self.proto if self.passes and not self.large else self.path

    @property
    def custom_domains(self) -> dict[str, int]:
        return {d: v for d, v in self.opset.items() if d not in STANDARD_DOMAINS}


def load_model(path: Path) -> SourceModel:
    """Read and check an ONNX file; ModelError with one clear sentence if it is not usable."""
    if not path.is_file():
        raise ModelError(f"model file {path} not found")
    try:
        check_size(path)
        large = is_large(path)  # weights in external data beyond protobuf's limit: the graph alone is read
        proto = onnx.load(str(path), load_external_data=not large)
    except onnx.checker.ValidationError as err:  # external data that is missing or outside the model's folder
        first = str(err).strip().splitlines()[0].rstrip(".")
        raise ModelError(
            f"{path} names weights (external data) it cannot have: {first}; keep the data files in the model's "
            "folder (or below it), as `onnx.save_model(..., save_as_external_data=True)` writes them"
        ) from err
    except (DecodeError, ValueError, RuntimeError, OSError) as err:
        raise ModelError(f"{path} is not an ONNX model (cannot parse protobuf: {err})") from err
    if not proto.graph.node or not proto.opset_import:
        raise ModelError(f"{path} is not an ONNX model (no graph nodes or no opset import)")
    if large:
        check_locations(path, proto)
    try:
        onnx.checker.check_model(str(path) if large else proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"{path} is not a valid ONNX model: {first}") from err
    normalized = normalize(proto, fold_weight_inputs=not large)
    proto = normalized.proto
    if large and normalized.passes:
        rewrites = ", ".join(f"{p.name} {p.params}" for p in normalized.passes)
        raise ModelError(
            f"{path.name} is over protobuf's 2 GiB limit with its external data, so it is converted as exported, "
            f"but it needs rewrites first ({rewrites}): export it with tensor outputs and positive or symbolic dims"
        )
    initializers = {init.name for init in proto.graph.initializer}
    return SourceModel(
        path=path,
        proto=proto,
        sha256=sha256_file(path),
        inputs=[tensor_spec(v) for v in proto.graph.input if v.name not in initializers],
        outputs=[tensor_spec(v) for v in proto.graph.output],
        opset={(imp.domain or ""): int(imp.version) for imp in proto.opset_import},
        passes=normalized.passes,
        class_labels=normalized.class_labels,
        large=large,
        quantization=detect(proto),
    )
