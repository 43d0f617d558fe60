"""Custom operators: find them, decide per target whether to keep or decompose them, inline standard-op
decompositions, and run models that still hold them on this host (the FP32 reference needs the real op).

A custom op ties a model to the runtimes that implement it, so standard ops are preferred: where a known
decomposition exists the converter inlines it (an ONNX function in standard ops, gated against the FP32
reference like every graph pass), unless the policy says to keep custom ops on targets that can load them.

Implementations and decompositions come from *custom-op packages*: Python modules named in the
`EDGEFLEET_CUSTOM_OPS` environment variable (file paths or module names, separated by the OS path separator) or
registered under the `edgefleet.custom_ops` entry-point group. A package exposes `EDGEFLEET_CUSTOM_OPS`, a list
of operator definitions with these attributes (models/custom_op/swish_op.py is the worked example):

    domain, op_type, since_version        the operator as the model names it
    inputs, outputs                       element types: "float", "double", "int64", "int32", "bool", ...
    attributes                            name → "float" | "int64" | "string"
    compute(*inputs, **attributes)        numpy implementation (run through onnxruntime-extensions)
    decomposition(opset) -> FunctionProto optional: the same operator in standard ONNX ops
    library                               optional: file name of a compiled custom-op library implementing it

A few ONNX Runtime contrib ops (com.microsoft Gelu, BiasGelu, QuickGelu) have built-in decompositions.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import onnx
import onnx.inliner
from onnx import helper

from edgefleet.converter.model import STANDARD_DOMAINS, walk_nodes
from edgefleet.core.errors import ConversionError, UserInputError
from edgefleet.core.manifest import CustomOp

log = logging.getLogger(__name__)

ENV_VAR = "EDGEFLEET_CUSTOM_OPS"
LIBRARY_ENV_VAR = "EDGEFLEET_CUSTOM_OP_LIBS"  # directories holding compiled custom-op libraries
ENTRY_POINT_GROUP = "edgefleet.custom_ops"
CONTRIB_DOMAIN = "ai.onnx.contrib"  # where onnxruntime-extensions registers Python ops
Policy = Literal["decompose", "host", "keep"]
POLICIES: tuple[Policy, ...] = ("decompose", "host", "keep")
MIN_FUNCTION_OPSET = 12  # Constant(value_float) with an attribute reference


@dataclass(frozen=True)
class OpPackageEntry:
    """One operator definition from a custom-op package, validated."""

    domain: str
    op_type: str
    since_version: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, str]
    compute: Callable[..., Any] | None
    decomposition: Callable[[int], onnx.FunctionProto] | None
    library: str | None
    origin: str

    @property
    def key(self) -> str:
        return f"{self.domain}::{self.op_type}"


def _entry(obj: Any, origin: str) -> OpPackageEntry:
    try:
        domain, op_type, version = str(obj.domain), str(obj.op_type), int(getattr(obj, "since_version", 1))
    except AttributeError as err:
        raise UserInputError(f"custom-op package {origin}: {obj!r} lacks {err.name}") from err
    if not domain or domain in STANDARD_DOMAINS:
        raise UserInputError(f"custom-op package {origin}: {op_type} must live in its own domain, not {domain!r}")
    return OpPackageEntry(
        domain=domain,
        op_type=op_type,
        since_version=version,
        inputs=tuple(getattr(obj, "inputs", ("float",))),
        outputs=tuple(getattr(obj, "outputs", ("float",))),
        attributes=dict(getattr(obj, "attributes", {})),
        compute=getattr(obj, "compute", None),
        decomposition=getattr(obj, "decomposition", None),
        library=getattr(obj, "library", None),
        origin=origin,
    )


def _import(spec: str) -> Any:
    path = Path(spec)
    if path.suffix == ".py":
        if not path.is_file():
            raise UserInputError(f"custom-op package {spec} not found (from ${ENV_VAR})")
        name = f"edgefleet_custom_ops_{abs(hash(str(path.resolve())))}"
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise UserInputError(f"cannot import custom-op package {spec}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as err:
        raise UserInputError(f"cannot import custom-op package {spec!r} (from ${ENV_VAR}): {err}") from err


def _sources() -> list[tuple[str, Callable[[], Any]]]:
    found: list[tuple[str, Callable[[], Any]]] = []
    for spec in filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep)):
        found.append((spec, lambda spec=spec: _import(spec)))  # type: ignore[misc]
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.append((f"entry point {point.name}", point.load))
    return found


_PACKAGES: dict[tuple[str, ...], dict[str, OpPackageEntry]] = {}


def packages() -> dict[str, OpPackageEntry]:
    """Every operator the configured custom-op packages define, by `domain::op_type` (imported once)."""
    sources = _sources()
    key = tuple(name for name, _ in sources)
    if key not in _PACKAGES:
        ops: dict[str, OpPackageEntry] = {}
        for name, load in sources:
            module = load()
            definitions = getattr(module, "EDGEFLEET_CUSTOM_OPS", module)
            for obj in definitions if isinstance(definitions, list | tuple) else [definitions]:
                entry = _entry(obj, name)
                ops.setdefault(entry.key, entry)
        _PACKAGES[key] = ops
    return _PACKAGES[key]


# --- what the model holds -----------------------------------------------------------------------------------


def custom_ops(model: onnx.ModelProto) -> list[CustomOp]:
    """Operators outside the standard domains (counting If/Loop/Scan bodies), except the model's own functions."""
    opsets = {(imp.domain or ""): int(imp.version) for imp in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    known = packages()
    found: dict[tuple[str, str], CustomOp] = {}
    for node, _where in walk_nodes(model.graph):
        domain = node.domain or ""
        if domain in STANDARD_DOMAINS or (domain, node.op_type) in local or (domain, node.op_type) in found:
            continue
        entry = known.get(f"{domain}::{node.op_type}")
        found[(domain, node.op_type)] = CustomOp(
            domain=domain, op_type=node.op_type, version=opsets.get(domain, 0), library=entry.library if entry else None
        )
    return sorted(found.values(), key=lambda op: op.key)


@cache
def ort_native_ops() -> frozenset[tuple[str, str]]:
    """(domain, op) pairs ONNX Runtime's CPU EP implements in non-standard domains (com.microsoft, ...)."""
    from onnxruntime.capi import _pybind_state

    kernels: list[Any] = getattr(_pybind_state, "get_all_opkernel_def", list)()
    return frozenset((k.domain, k.op_name) for k in kernels if k.domain not in STANDARD_DOMAINS)


def hosts_custom_ops(runtime: str, bundle_format: str) -> bool:
    """Whether a target can load custom-op implementations: ONNX Runtime can (registered libraries, Python ops
    through onnxruntime-extensions; under the TensorRT EP those nodes run on the CPU between engine partitions).
    OpenVINO, CoreML (through onnx2torch) and onnxruntime-web cannot."""
    return runtime == "onnxruntime" and bundle_format in ("onnx", "onnx-tensorrt")


# --- decompositions -------------------------------------------------------------------------------------------


def _gelu(opset: int) -> onnx.FunctionProto:
    nodes = [
        helper.make_node("Constant", [], ["sqrt2"], value_float=2.0**0.5),
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Div", ["X", "sqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["plus"]),
        helper.make_node("Mul", ["X", "plus"], ["prod"]),
        helper.make_node("Mul", ["prod", "half"], ["Y"]),
    ]
    return helper.make_function("com.microsoft", "Gelu", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)])


def _bias_gelu(opset: int) -> onnx.FunctionProto:
    inner = _gelu(opset)
    nodes = [helper.make_node("Add", ["A", "B"], ["X"]), *inner.node]
    return helper.make_function("com.microsoft", "BiasGelu", ["A", "B"], ["Y"], nodes, [helper.make_opsetid("", opset)])


def _quick_gelu(opset: int) -> onnx.FunctionProto:
    alpha = helper.make_node("Constant", [], ["alpha"], value_float=1.702)
    alpha.attribute[0].ref_attr_name = "alpha"
    nodes = [
        alpha,
        helper.make_node("Mul", ["X", "alpha"], ["scaled"]),
        helper.make_node("Sigmoid", ["scaled"], ["gate"]),
        helper.make_node("Mul", ["X", "gate"], ["Y"]),
    ]
    return helper.make_function(
        "com.microsoft", "QuickGelu", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)],
        attributes=[], attribute_protos=[helper.make_attribute("alpha", 1.702)],
    )  # fmt: skip


BUILT_IN: dict[str, Callable[[int], onnx.FunctionProto]] = {
    "com.microsoft::Gelu": _gelu,
    "com.microsoft::BiasGelu": _bias_gelu,
    "com.microsoft::QuickGelu": _quick_gelu,
}


def decompositions() -> dict[str, tuple[Callable[[int], onnx.FunctionProto], str]]:
    """op key → (function factory taking the model's default opset, where it comes from)."""
    found = {key: (factory, "built in") for key, factory in BUILT_IN.items()}
    for key, entry in packages().items():
        if entry.decomposition is not None:
            found[key] = (entry.decomposition, entry.origin)
    return found


@dataclass(frozen=True)
class DecomposeConfig:
    ops: tuple[str, ...]  # `domain::op_type` keys to replace


def decompose(model: onnx.ModelProto, config: DecomposeConfig) -> onnx.ModelProto:
    """Inline the standard-op decomposition of each listed custom op; drop domains no node uses any more."""
    from edgefleet.converter.passes.graph import copy_model, default_opset

    known = decompositions()
    unknown = [key for key in config.ops if key not in known]
    if unknown:
        raise ConversionError(f"no standard-op decomposition is known for {', '.join(unknown)}")
    opset = default_opset(model)
    if opset < MIN_FUNCTION_OPSET:
        raise ConversionError(f"decompositions need default-domain opset {MIN_FUNCTION_OPSET}+, the model has {opset}")
    out = copy_model(model)
    ids = []
    for key in config.ops:
        try:
            function = known[key][0](opset)
        except Exception as err:  # a package's factory is user code
            raise ConversionError(f"the decomposition of {key} ({known[key][1]}) failed: {err}") from err
        if f"{function.domain}::{function.name}" != key:
            raise ConversionError(f"the decomposition of {key} defines {function.domain}::{function.name}")
        out.functions.append(function)
        ids.append((function.domain, function.name))
    try:
        out = onnx.inliner.inline_selected_functions(out, ids)
    except Exception as err:  # the inliner raises its own C++ errors
        raise ConversionError(f"inlining decompositions failed: {err}") from err
    _drop_unused_domains(out)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as err:
        raise ConversionError(f"the decomposed model does not check: {str(err).splitlines()[0]}") from err
    return out


def _drop_unused_domains(model: onnx.ModelProto) -> None:
    used = {node.domain or "" for node, _ in walk_nodes(model.graph)}
    used |= {f.domain for f in model.functions} | {"", "ai.onnx"}
    keep = [imp for imp in model.opset_import if (imp.domain or "") in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


@dataclass(frozen=True)
class Plan:
    decompose: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    blocked: dict[str, str] = field(default_factory=dict)  # op key → why the target cannot have it


def plan(ops: Iterable[CustomOp], policy: Policy, runtime: str, bundle_format: str) -> Plan:
    """Which custom ops to decompose, which to keep, and which block the target. Pure."""
    hosts = hosts_custom_ops(runtime, bundle_format)
    known = decompositions()
    decompose_, keep, blocked = [], [], {}
    cannot = f"{runtime} ({bundle_format}) cannot load custom operators"
    for op in ops:
        has = op.key in known
        if policy == "decompose" and has:
            decompose_.append(op.key)
        elif hosts:
            keep.append(op.key)
        elif policy != "keep" and has:
            decompose_.append(op.key)
        elif policy == "keep":
            blocked[op.key] = f"{cannot}, and the custom-op policy is 'keep' (no decomposition)"
        else:
            blocked[op.key] = f"{cannot} and no standard-op decomposition is known (add one to its custom-op package)"
    return Plan(tuple(decompose_), tuple(keep), blocked)


# --- running models that hold custom ops on this host ---------------------------------------------------------

_PYOP_TYPES = {
    "float": "dt_float", "float32": "dt_float", "double": "dt_double", "float64": "dt_double",
    "float16": "dt_float16", "int64": "dt_int64", "int32": "dt_int32", "uint8": "dt_uint8", "int8": "dt_int8",
    "bool": "dt_bool", "string": "dt_string",
}  # fmt: skip
_REGISTERED: set[str] = set()
_LOCK = threading.Lock()


def contrib_name(key: str) -> str:
    """The op type a package op is registered under in ai.onnx.contrib (unique across domains)."""
    domain, op_type = key.split("::", 1)
    return f"{domain.replace('.', '_')}__{op_type}"


def _register_python_ops(entries: Iterable[OpPackageEntry]) -> str:
    """Register the ops with onnxruntime-extensions; returns its custom-op library path."""
    try:
        import onnxruntime_extensions as ext
    except ImportError as err:
        raise ConversionError(
            "running Python custom ops needs onnxruntime-extensions (pip install onnxruntime-extensions)"
        ) from err
    with _LOCK:
        for entry in entries:
            name = contrib_name(entry.key)
            if name in _REGISTERED or entry.compute is None:
                continue
            types = [getattr(ext.PyOp, _PYOP_TYPES[t]) for t in entry.inputs]
            outs = [getattr(ext.PyOp, _PYOP_TYPES[t]) for t in entry.outputs]
            attrs = {k: getattr(ext.PyOp, _PYOP_TYPES[v]) for k, v in entry.attributes.items()}
            ext.onnx_op(op_type=name, inputs=types, outputs=outs, attrs=attrs)(entry.compute)
            _REGISTERED.add(name)
    return str(ext.get_library_path())


def rename_to_contrib(model: onnx.ModelProto, keys: Iterable[str]) -> onnx.ModelProto:
    """A copy whose listed custom ops are addressed as onnxruntime-extensions registers them."""
    from edgefleet.converter.passes.graph import copy_model

    wanted = set(keys)
    out = copy_model(model)
    for node, _ in walk_nodes(out.graph):
        key = f"{node.domain}::{node.op_type}"
        if key in wanted:
            node.domain, node.op_type = CONTRIB_DOMAIN, contrib_name(key)
    if wanted and not any(imp.domain == CONTRIB_DOMAIN for imp in out.opset_import):
        out.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    _drop_unused_domains(out)
    return out


def host_session_source(model: onnx.ModelProto) -> tuple[bytes, list[str]]:
    """(model bytes, custom-op libraries to register) so that ONNX Runtime on this host runs `model`.

    ConversionError names the ops nothing here implements."""
    known = packages()
    native = ort_native_ops()
    python, libraries, missing = [], [], []
    for op in custom_ops(model):
        entry = known.get(op.key)
        if (op.domain, op.op_type) in native:
            continue
        if entry is not None and entry.compute is not None:
            python.append(entry)
        elif entry is not None and entry.library:
            libraries.append(entry.library)
        else:
            missing.append(op.key)
    if missing:
        raise ConversionError(
            f"custom operators {', '.join(missing)} have no implementation on this host: name their custom-op "
            f"package in ${ENV_VAR} (see models/custom_op/README.md)"
        )
    paths = [find_library(name) for name in dict.fromkeys(libraries)]
    if not python:
        return model.SerializeToString(), paths
    library = _register_python_ops(python)
    return rename_to_contrib(model, [e.key for e in python]).SerializeToString(), [library, *paths]


def find_library(name: str) -> str:
    """A compiled custom-op library by file name, from the directories in $EDGEFLEET_CUSTOM_OP_LIBS."""
    folders = [Path(d) for d in os.environ.get(LIBRARY_ENV_VAR, "").split(os.pathsep) if d]
    for folder in folders:
        if (folder / name).is_file():
            return str(folder / name)
    raise ConversionError(f"custom-op library {name} not found in ${LIBRARY_ENV_VAR} ({[str(f) for f in folders]})")
