"""Models over protobuf's 2 GiB limit, with their weights in external data files.

Such a model cannot be held as one serialized ModelProto: the converter's graph passes, quantizers, OpenVINO's
conversion from a proto, onnx2torch and the browser's single buffer all need that. What still works is the model
as exported: its graph is read without its weights (`onnx.load(..., load_external_data=False)`) for inspection,
ONNX Runtime runs it from its path, loading the external data beside it, and OpenVINO's converter reads it from
its path too. So a large model converts to the FP32 recipe on ONNX Runtime targets (the bundle holds
`model/model.onnx` and its external data files under the same relative names) and to OpenVINO IR with its
inference-precision hints (the IR's .bin has no such limit); every other candidate is refused with the reason
its tool cannot take it.

`normalize.PROTOBUF_LIMIT` decides what is large (tests lower it to exercise this path on a small model).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import onnx
from onnx import TensorProto

from edgefleet.converter.passes import normalize
from edgefleet.core.errors import ConversionError, ModelError

PATH_ONLY = "ort-fp32"  # the one kind that runs the model from its path, as exported


def external_files(proto: onnx.ModelProto) -> list[str]:
    """The external data files the model names, relative to its own directory, in first-use order."""
    found: dict[str, None] = {}
    for tensor in normalize.all_initializers(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
            found.setdefault(location, None)
    return list(found)


def check_locations(path: Path, proto: onnx.ModelProto) -> None:
    for location in external_files(proto):
        pure = PurePosixPath(location)
        if not location or pure.is_absolute() or ".." in pure.parts:
            raise ModelError(f"{path.name} names external data {location!r} outside its own directory")
        if not (path.parent / location).is_file():
            raise ModelError(f"{path.name} names external data {location!r}, which is not beside it")


def refusal(kind: str, runtime: str, fmt: str) -> str | None:
    """Why a candidate cannot be built from a model over the limit; None for the one that can."""
    limit = f"over protobuf's {normalize.PROTOBUF_LIMIT / 2**30:.2g} GiB limit"
    if (kind == PATH_ONLY and runtime == "onnxruntime" and fmt == "onnx") or kind == "ov":
        return None
    if runtime == "onnxruntime-web":
        return (
            f"a model {limit} cannot ship to onnxruntime-web: the page fetches one model buffer into WebAssembly "
            "memory (4 GiB at most) and ORT format files are one flatbuffer"
        )
    if kind == "coreml":
        return f"a model {limit}: onnx2torch needs the whole model as one protobuf to convert it for CoreML"
    if kind == "trt":
        return (
            f"a model {limit}: the TensorRT bundle's INT8/FP16 preparation rewrites the graph as one protobuf; "
            "not built (ship the ONNX Runtime target, whose TensorRT EP reads external data from the path)"
        )
    if kind == "ov-nncf":
        return f"a model {limit}: NNCF INT8 is not built for it yet (OpenVINO FP32 IR from its path is)"
    return (
        f"a model {limit} is converted as exported (FP32 on ONNX Runtime, run from its path): graph passes and "
        f"the {kind} recipe serialize the whole model as one protobuf"
    )


def stage(source_path: Path, proto: onnx.ModelProto, directory: Path) -> dict[str, Path]:
    """The model file and its external data, linked (or copied) into `directory` under the same relative names;
    returns bundle-relative name → staged file."""
    files: dict[str, Path] = {}
    for name in [source_path.name, *external_files(proto)]:
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source_path.parent / name, target)
        except OSError:  # another file system, or links not allowed: copy
            shutil.copyfile(source_path.parent / name, target)
        rel = "model/model.onnx" if name == source_path.name else f"model/{name}"
        files[rel] = target
    model = directory / source_path.name
    if source_path.name != "model.onnx":  # the bundle names it model.onnx; its data keeps its relative names
        renamed = directory / "model.onnx"
        if renamed.exists():
            raise ConversionError(f"external data named model.onnx beside {source_path.name}")
        model.rename(renamed)
        files["model/model.onnx"] = renamed
    return files


def openvino(path: Path, config: Any) -> Any:
    """OpenVINO's model read from the path (its converter loads the external data itself), as an artifact."""
    import openvino as ov

    from edgefleet.converter.passes.openvino import OpenVINOArtifact

    try:
        converted = ov.convert_model(str(path))
    except Exception as err:  # OpenVINO raises OpConversionFailure / RuntimeError with a long report
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"OpenVINO cannot convert the model from its path: {first}") from err
    return OpenVINOArtifact(converted, config.inference_precision_hint, config.compress_to_fp16)
