"""Bodies of the Open Inference Protocol (v2, KServe/Triton): the JSON tensor format and the binary tensor
data extension (`Inference-Header-Content-Length`), decoded under the body guard's limits.

A request is a JSON header, optionally followed by the raw bytes of the inputs that declare
`parameters.binary_data_size`, in input order. An answer returns each output as JSON data, or as raw bytes
after the JSON header when the request asks for it (`binary_data` per output, or `binary_data_output`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgefleet.agent.api.body_guard import bad, check_shape, element_count, load_json, spec_for
from edgefleet.agent.api.finite import check_json_output
from edgefleet.agent.api.label_outputs import BYTES, bytes_blob, is_text, text_list
from edgefleet.agent.api.string_inputs import check_text_shape, takes_text, text_from_binary, text_from_json
from edgefleet.core.bundle.manifest import Manifest, TensorSpec

HEADER_LENGTH = "Inference-Header-Content-Length"
OCTET = "application/octet-stream"
_TO_NUMPY = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}  # fmt: skip
_TO_OIP = {dtype.str: name for name, dtype in _TO_NUMPY.items()}  # keyed by dtype.str: a fast lookup
_MAX_ID = 256
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def oip_datatype(dtype: str | np.dtype[Any]) -> str:
    found = _TO_OIP.get(dtype.str) if isinstance(dtype, np.dtype) else None
    if found:
        return found
    numpy_dtype = np.dtype(dtype)
    return BYTES if numpy_dtype.kind in "OUS" else _TO_OIP.get(numpy_dtype.str, str(dtype).upper())


def oip_shape(shape: Sequence[int | str | None]) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in shape]


def tensor_metadata(
    specs: Sequence[TensorSpec], class_labels: Mapping[str, Sequence[str | int]] | None = None
) -> list[dict[str, Any]]:
    """OIP tensor metadata; an output with class labels (a ZipMap turned into a tensor) names each column's class
    in `parameters.class_labels`."""
    found = []
    for s in specs:
        entry: dict[str, Any] = {"name": s.name, "datatype": oip_datatype(s.dtype), "shape": oip_shape(s.shape)}
        if class_labels and s.name in class_labels:
            entry["parameters"] = {"class_labels": list(class_labels[s.name])}
        found.append(entry)
    return found


def model_metadata(manifest: Manifest) -> dict[str, Any]:
    platform = {"onnx": "onnxruntime_onnx", "openvino-ir": "openvino", "coreml": "coreml"}.get(manifest.format)
    return {
        "name": manifest.model_name,
        "versions": [manifest.model_version],
        "platform": platform or manifest.format,
        "inputs": tensor_metadata(manifest.inputs),
        "outputs": tensor_metadata(manifest.outputs, manifest.class_labels),
    }


@dataclass(frozen=True)
class OipRequest:
    id: str | None
    feeds: dict[str, np.ndarray]
    outputs: list[str] | None  # requested output names, None: all
    binary: dict[str, bool]  # per requested output
    binary_default: bool


@dataclass(frozen=True)
class _Plan:
    """A validated all-binary request header: clients send the same one again and again."""

    id: str | None
    inputs: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]  # name, dtype, shape, bytes
    outputs: list[str] | None
    binary: dict[str, bool]
    binary_default: bool


_PLANS: dict[tuple[str, bytes], _Plan] = {}
_PLAN_CACHE_SIZE = 256


def _from_plan(plan: _Plan, body: memoryview, split: int) -> OipRequest:
    feeds: dict[str, np.ndarray] = {}
    offset = split
    for name, dtype, shape, size in plan.inputs:
        feeds[name] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(shape)
        offset += size
    if offset != len(body):
        raise bad(f"the binary data holds {len(body) - split} bytes; the inputs declare {offset - split}")
    return OipRequest(plan.id, feeds, plan.outputs, plan.binary, plan.binary_default)


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(f"{where}: parameters must be an object")
    for name in _UNSUPPORTED_PARAMETERS:
        if name in value:
            raise bad(f"{where}: shared memory is not supported by this server; send the data in the request")
    return value


def decode_request(body: bytes, header_length: str | None, manifest: Manifest, limit: int) -> OipRequest:
    """An OIP infer request → input arrays and what to answer; every malformed part is a 400."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise bad(f"{HEADER_LENGTH} {header_length[:32]!r} does not fit a body of {len(body)} bytes")
        split = int(header_length)
    else:
        split = len(body)
    view = memoryview(body)
    key = (manifest.bundle_id, bytes(view[:split])) if split < len(body) and split <= 4096 else None
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None:
        return _from_plan(plan, view, split)
    document = load_json(view[:split])
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), list):
        raise bad('an OIP request is {"inputs": [{"name", "shape", "datatype", "data"}], ...}')
    request_id = document.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > _MAX_ID):
        raise bad(f"id must be a string of at most {_MAX_ID} characters")
    parameters = _parameters(document.get("parameters"), "request")
    feeds: dict[str, np.ndarray] = {}
    offset = split
    for index, tensor in enumerate(document["inputs"]):
        array, used = _input(tensor, index, view, offset, manifest, limit)
        name = tensor["name"]
        if name in feeds:
            raise bad(f"input {name!r} is given twice")
        feeds[name] = array
        offset += used
    if offset != len(body):
        raise bad(f"the binary data holds {len(body) - split} bytes; the inputs declare {offset - split}")
    outputs, binary = _requested_outputs(document.get("outputs"), manifest)
    binary_default = bool(parameters.get("binary_data_output", False))
    cacheable = all(a.dtype.kind != "O" for a in feeds.values())  # strings are parsed every time
    if key is not None and cacheable and all("data" not in tensor for tensor in document["inputs"]):
        if len(_PLANS) >= _PLAN_CACHE_SIZE:
            _PLANS.clear()
        described = tuple((name, a.dtype, a.shape, a.nbytes) for name, a in feeds.items())
        _PLANS[key] = _Plan(request_id, described, outputs, binary, binary_default)
    return OipRequest(request_id, feeds, outputs, binary, binary_default)


def _input(
    tensor: Any, index: int, body: memoryview, offset: int, manifest: Manifest, limit: int
) -> tuple[np.ndarray, int]:
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise bad(f"inputs[{index}] must be an object with name, shape, datatype and data")
    name = tensor["name"]
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    dtype = _TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
    if dtype is None and datatype != BYTES:
        raise bad(f"input {name!r}: datatype {datatype!r} is not supported; use one of {sorted([*_TO_NUMPY, BYTES])}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad(f"input {name!r}: shape must be a list of non-negative integers")
    spec = spec_for(manifest.inputs, name)
    if spec is None:
        raise bad(f"input {name!r} is not an input of the model ({[s.name for s in manifest.inputs]})")
    parameters = _parameters(tensor.get("parameters"), f"input {name!r}")
    if dtype is None or takes_text(spec):
        return _text_input(name, datatype, shape, spec, tensor, parameters, body, offset, limit)
    nbytes = check_shape(name, shape, dtype, spec, limit)
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size != nbytes:
            raise bad(f"input {name!r}: binary_data_size {size!r} does not match shape {shape} of {datatype}")
        if offset + size > len(body):
            raise bad(f"input {name!r}: the body ends before its {size} bytes of binary data")
        array = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(shape)
        return array, size
    if "data" not in tensor:
        raise bad(f"input {name!r} has neither data nor parameters.binary_data_size")
    try:
        array = np.array(tensor["data"], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise bad(f"input {name!r}: data does not convert to {datatype}: {err}") from err
    if array.size != element_count(shape):
        raise bad(f"input {name!r}: data holds {array.size} values, shape {shape} needs {element_count(shape)}")
    return array.reshape(shape), 0


def _text_input(
    name: str, datatype: Any, shape: list[int], spec: TensorSpec, tensor: dict[str, Any], parameters: dict[str, Any],
    body: memoryview, offset: int, limit: int,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """A BYTES input (agent/api/string_inputs.py): only for a string input, and a string input takes only BYTES."""
    if datatype != BYTES or not takes_text(spec):
        wants = BYTES if takes_text(spec) else oip_datatype(spec.dtype)
        raise bad(f"input {name!r} is {wants} in this model; the request sends {datatype}")
    check_text_shape(name, shape, spec)
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise bad(f"input {name!r}: binary_data_size {size!r} is not a byte count")
        if offset + size > len(body):
            raise bad(f"input {name!r}: the body ends before its {size} bytes of binary data")
        return text_from_binary(name, shape, body[offset : offset + size], limit), size
    if "data" not in tensor:
        raise bad(f"input {name!r} has neither data nor parameters.binary_data_size")
    return text_from_json(name, shape, tensor["data"], limit), 0


def _requested_outputs(value: Any, manifest: Manifest) -> tuple[list[str] | None, dict[str, bool]]:
    if value is None:
        return None, {}
    if not isinstance(value, list):
        raise bad("outputs must be a list of {name, parameters}")
    known = [spec.name for spec in manifest.outputs]
    names: list[str] = []
    binary: dict[str, bool] = {}
    for index, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise bad(f"outputs[{index}] must be an object with a name")
        name = item["name"]
        if name not in known:
            raise bad(f"output {name!r} is not an output of the model ({known})")
        parameters = _parameters(item.get("parameters"), f"output {name!r}")
        if "binary_data" in parameters:
            binary[name] = bool(parameters["binary_data"])
        names.append(name)
    return names, binary


def encode_response(
    request: OipRequest,
    model_name: str,
    model_version: str,
    request_id: str,
    outputs: Mapping[str, np.ndarray],
    class_labels: Mapping[str, Sequence[str | int]] | None = None,
) -> tuple[bytes, str, dict[str, str]]:
    """(body, content type, extra headers): JSON, or a JSON header then raw output bytes.

    String outputs are BYTES (agent/api/label_outputs.py); an output with class labels names them in its parameters.
    The header is written directly (names and ids through json.dumps): this runs on every request.
    """
    names = request.outputs if request.outputs is not None else list(outputs)
    described: list[str] = []
    blobs: list[bytes] = []
    for name in names:
        array = np.ascontiguousarray(outputs[name])
        text = is_text(array)
        head = f'{{"name":{json.dumps(name)},"datatype":"{oip_datatype(array.dtype)}","shape":{list(array.shape)}'
        labels = class_labels.get(name) if class_labels else None
        extra = f',"class_labels":{json.dumps(list(labels))}' if labels else ""
        if request.binary.get(name, request.binary_default):
            blob = bytes_blob(array) if text else array.tobytes()
            described.append(f'{head},"parameters":{{"binary_data_size":{len(blob)}{extra}}}}}')
            blobs.append(blob)
        else:
            check_json_output(name, array, 'ask for it as binary data ("binary_data": true in its parameters)')
            data = text_list(array) if text else array.ravel().tolist()
            parameters = f',"parameters":{{{extra[1:]}}}' if extra else ""
            described.append(f'{head}{parameters},"data":{json.dumps(data)}}}')
    header = (
        f'{{"model_name":{json.dumps(model_name)},"model_version":{json.dumps(model_version)},'
        f'"id":{json.dumps(request_id)},"outputs":[{",".join(described)}]}}'
    ).encode()
    if not blobs:
        return header, "application/json", {}
    return b"".join((header, *blobs)), OCTET, {HEADER_LENGTH: str(len(header))}
