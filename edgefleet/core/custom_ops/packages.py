"""Custom-op packages, as both the converter (host) and the agent (device) load them.

A custom-op package is a Python module named in $EDGEFLEET_CUSTOM_OPS (file paths or module names, separated by the
OS path separator), given on the command line, or registered under the `edgefleet.custom_ops` entry-point group.
It exposes `EDGEFLEET_CUSTOM_OPS`, a list of operator definitions with these attributes (models/custom_op/swish_op.py
is the worked example):

    domain, op_type, since_version        the operator as the model names it
    inputs, outputs                       element types: "float", "double", "int64", "int32", "bool", ...
    attributes                            name → "float" | "int64" | "string"
    compute(*inputs, **attributes)        numpy implementation (run through onnxruntime-extensions)
    decomposition(opset) -> FunctionProto optional: the same operator in standard ONNX ops (converter only)
    library                               optional: file name of a compiled custom-op library implementing it

This module holds what both sides share: finding and importing packages, validating their definitions, finding
compiled libraries, the ops ONNX Runtime implements natively, and handing Python ops to onnxruntime-extensions
(which registers them under `ai.onnx.contrib`, so each op is registered as `<domain>__<op>` there and the model's
nodes are renamed to match). It imports neither onnx nor onnxruntime-extensions: callers pass the module they
imported, each with its own guarded import and error.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from edgefleet.core.errors import UserInputError

log = logging.getLogger(__name__)

ENV_VAR = "EDGEFLEET_CUSTOM_OPS"
LIBRARY_ENV_VAR = "EDGEFLEET_CUSTOM_OP_LIBS"  # directories holding compiled custom-op libraries
ENTRY_POINT_GROUP = "edgefleet.custom_ops"
CONTRIB_DOMAIN = "ai.onnx.contrib"  # where onnxruntime-extensions registers Python ops
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"})
_PYOP_TYPES = {
    "float": "dt_float", "float32": "dt_float", "double": "dt_double", "float64": "dt_double",
    "float16": "dt_float16", "int64": "dt_int64", "int32": "dt_int32", "uint8": "dt_uint8", "int8": "dt_int8",
    "bool": "dt_bool", "string": "dt_string",
}  # fmt: skip


class CustomOpPackageError(UserInputError):
    """A custom-op package that cannot be imported, or an operator definition that is not valid."""


@dataclass(frozen=True)
class OpDefinition:
    """One operator definition from a custom-op package, validated."""

    domain: str
    op_type: str
    since_version: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, str]
    compute: Callable[..., Any] | None
    decomposition: Callable[[int], Any] | None
    library: str | None
    origin: str

    @property
    def key(self) -> str:
        return f"{self.domain}::{self.op_type}"

    @property
    def contrib_name(self) -> str:
        return contrib_name(self.key)


def contrib_name(key: str) -> str:
    """The op type a package op is registered under in ai.onnx.contrib (unique across domains)."""
    domain, op_type = key.split("::", 1)
    return f"{domain.replace('.', '_')}__{op_type}"


def _definition(obj: Any, origin: str) -> OpDefinition:
    try:
        domain, op_type, version = str(obj.domain), str(obj.op_type), int(getattr(obj, "since_version", 1))
    except AttributeError as err:
        raise CustomOpPackageError(f"custom-op package {origin}: {obj!r} lacks {err.name}") from err
    if not domain or domain in STANDARD_DOMAINS:
        raise CustomOpPackageError(f"custom-op package {origin}: {op_type} must live in its own domain, not {domain!r}")
    return OpDefinition(
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


def import_package(spec: str) -> Any:
    """Import a package named by a `.py` path or a module name."""
    path = Path(spec)
    if path.suffix == ".py":
        if not path.is_file():
            raise CustomOpPackageError(f"custom-op package {spec} not found (from ${ENV_VAR})")
        name = f"edgefleet_custom_ops_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise CustomOpPackageError(f"cannot import custom-op package {spec}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as err:
        raise CustomOpPackageError(f"cannot import custom-op package {spec!r} (from ${ENV_VAR}): {err}") from err


def package_specs(extra: Sequence[str] = ()) -> list[str]:
    """The packages given on the command line, then those in $EDGEFLEET_CUSTOM_OPS."""
    return [*extra, *filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep))]


_LOCK = threading.Lock()
_LOADED: dict[tuple[tuple[str, ...], bool], dict[str, OpDefinition]] = {}


def load_definitions(extra_specs: Sequence[str] = (), *, strict: bool) -> dict[str, OpDefinition]:
    """Every operator the configured packages define, by `domain::op_type` (each package imported once).

    strict: a package that fails to import raises (the converter: a user error stops the build); otherwise it is
    logged and skipped (the agent keeps running, and bundles needing its ops are refused, naming them)."""
    specs = package_specs(extra_specs)
    points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    key = ((*specs, *(p.name for p in points)), strict)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
    sources: list[tuple[str, Callable[[], Any]]] = [(s, lambda s=s: import_package(s)) for s in specs]  # type: ignore[misc]
    sources += [(f"entry point {p.name}", p.load) for p in points]
    found: dict[str, OpDefinition] = {}
    for origin, load in sources:
        try:
            module = load()
            listed = getattr(module, "EDGEFLEET_CUSTOM_OPS", [])
            for obj in listed if isinstance(listed, list | tuple) else [listed]:
                definition = _definition(obj, origin)
                found.setdefault(definition.key, definition)
        except Exception as err:
            if strict:
                if isinstance(err, CustomOpPackageError):
                    raise
                raise CustomOpPackageError(f"custom-op package {origin} cannot be loaded: {err}") from err
            log.error("custom-op package %s cannot be loaded: %s", origin, err)
    with _LOCK:
        _LOADED[key] = found
    return found


def library_dirs(extra: Sequence[Path] = ()) -> list[Path]:
    """The library directories given on the command line, then those in $EDGEFLEET_CUSTOM_OP_LIBS."""
    return [*extra, *(Path(d) for d in os.environ.get(LIBRARY_ENV_VAR, "").split(os.pathsep) if d)]


def find_library(name: str, extra_dirs: Sequence[Path] = ()) -> Path | None:
    """A compiled custom-op library by file name, or None."""
    for folder in library_dirs(extra_dirs):
        if (folder / name).is_file():
            return folder / name
    return None


@cache
def ort_native_ops() -> frozenset[tuple[str, str]]:
    """(domain, op) pairs that this onnxruntime implements itself in non-standard domains (com.microsoft, ...)."""
    from onnxruntime.capi import _pybind_state

    kernels: list[Any] = getattr(_pybind_state, "get_all_opkernel_def", list)()
    return frozenset((k.domain, k.op_name) for k in kernels if k.domain not in STANDARD_DOMAINS)


_REGISTERED: set[str] = set()


def register_python_ops(ops: Iterable[OpDefinition], extensions: Any) -> str:
    """Register the ops' numpy implementations with onnxruntime-extensions (the imported module `extensions`),
    once each per process; returns the path of its custom-op library to register with a session."""
    with _LOCK:
        for op in ops:
            if op.contrib_name in _REGISTERED or op.compute is None:
                continue
            try:
                kinds = [getattr(extensions.PyOp, _PYOP_TYPES[t]) for t in op.inputs]
                outs = [getattr(extensions.PyOp, _PYOP_TYPES[t]) for t in op.outputs]
                attrs = {k: getattr(extensions.PyOp, _PYOP_TYPES[v]) for k, v in op.attributes.items()}
            except KeyError as err:
                raise CustomOpPackageError(f"{op.key} from {op.origin}: unknown element type {err.args[0]!r}") from err
            extensions.onnx_op(op_type=op.contrib_name, inputs=kinds, outputs=outs, attrs=attrs)(op.compute)
            _REGISTERED.add(op.contrib_name)
    return str(extensions.get_library_path())


def graphs(graph: Any) -> Iterator[Any]:
    """A graph and every subgraph (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from graphs(sub)


def rename_to_contrib(model: Any, keys: Iterable[str]) -> None:
    """Address the listed ops of an onnx ModelProto (in place, If/Loop/Scan bodies too) as onnxruntime-extensions
    registers them, and import the contrib domain."""
    wanted = set(keys)
    for graph in graphs(model.graph):
        for node in graph.node:
            key = f"{node.domain}::{node.op_type}"
            if key in wanted:
                node.domain, node.op_type = CONTRIB_DOMAIN, contrib_name(key)
    if wanted and not any(imp.domain == CONTRIB_DOMAIN for imp in model.opset_import):
        model.opset_import.add(domain=CONTRIB_DOMAIN, version=1)
