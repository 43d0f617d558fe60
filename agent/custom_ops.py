"""Custom operators on the device: which implementations this agent has, which a bundle lacks, and how a model
that holds them is handed to ONNX Runtime.

Implementations, in the order they are looked for:
- ONNX Runtime's own kernels in non-standard domains (com.microsoft contrib ops, ...);
- Python ops from custom-op packages (numpy `compute`, run through onnxruntime-extensions, which registers
  Python ops under the domain `ai.onnx.contrib`: the agent registers each as `<domain>__<op>` there and loads a
  copy of the model whose nodes are renamed accordingly);
- compiled custom-op libraries the bundle names (`CustomOp.library`), found by file name in the library
  directories, registered with `SessionOptions.register_custom_ops_library`.
Packages are Python modules named in $EDGEFLEET_CUSTOM_OPS (file paths or module names, separated by the OS path
separator) or registered under the `edgefleet.custom_ops` entry point; library directories come from
$EDGEFLEET_CUSTOM_OP_LIBS, or from `configure(...)`. A bundle never carries code: the device decides what it runs.
The package format is documented in models/custom_op/README.md. onnxruntime-extensions and onnx (for the
renaming) are optional: `pip install 'edgefleet[custom-ops]'`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from edgefleet.agent.backends import optional_import
from edgefleet.core.errors import BundleError
from edgefleet.core.manifest import CustomOp, Manifest

log = logging.getLogger(__name__)

ENV_VAR = "EDGEFLEET_CUSTOM_OPS"
LIBRARY_ENV_VAR = "EDGEFLEET_CUSTOM_OP_LIBS"
ENTRY_POINT_GROUP = "edgefleet.custom_ops"
CONTRIB_DOMAIN = "ai.onnx.contrib"
EXTRA = "custom-ops"
_STANDARD = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"})
_PYOP_TYPES = {
    "float": "dt_float", "float32": "dt_float", "double": "dt_double", "float64": "dt_double",
    "float16": "dt_float16", "int64": "dt_int64", "int32": "dt_int32", "uint8": "dt_uint8", "int8": "dt_int8",
    "bool": "dt_bool", "string": "dt_string",
}  # fmt: skip


@dataclass(frozen=True)
class PythonOp:
    """A Python (numpy) implementation of one custom op, from a custom-op package."""

    domain: str
    op_type: str
    since_version: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, str]
    compute: Callable[..., Any]
    origin: str

    @property
    def key(self) -> str:
        return f"{self.domain}::{self.op_type}"

    @property
    def contrib_name(self) -> str:
        return f"{self.domain.replace('.', '_')}__{self.op_type}"


@dataclass
class _Config:
    packages: list[str] = field(default_factory=list)  # set by configure(); added to $EDGEFLEET_CUSTOM_OPS
    library_dirs: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: dict[tuple[str, ...], dict[str, PythonOp]] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)


_CONFIG = _Config()


def configure(packages: Sequence[str] = (), library_dirs: Sequence[Path] = ()) -> None:
    """Custom-op packages and library directories given on the command line (beside the environment's)."""
    with _CONFIG.lock:
        _CONFIG.packages = list(packages)
        _CONFIG.library_dirs = list(library_dirs)


def _package_specs() -> list[str]:
    return [*_CONFIG.packages, *filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep))]


def _library_dirs() -> list[Path]:
    return [*_CONFIG.library_dirs, *(Path(d) for d in os.environ.get(LIBRARY_ENV_VAR, "").split(os.pathsep) if d)]


def _import(spec: str) -> Any:
    path = Path(spec)
    if path.suffix == ".py":
        name = f"edgefleet_custom_ops_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None or not path.is_file():
            raise ImportError(f"{spec} is not a readable Python file")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def _python_ops(module: Any, origin: str) -> list[PythonOp]:
    found = []
    for obj in getattr(module, "EDGEFLEET_CUSTOM_OPS", []):
        compute = getattr(obj, "compute", None)
        if compute is None:
            continue
        found.append(
            PythonOp(
                domain=str(obj.domain),
                op_type=str(obj.op_type),
                since_version=int(getattr(obj, "since_version", 1)),
                inputs=tuple(getattr(obj, "inputs", ("float",))),
                outputs=tuple(getattr(obj, "outputs", ("float",))),
                attributes=dict(getattr(obj, "attributes", {})),
                compute=compute,
                origin=origin,
            )
        )
    return found


def python_ops() -> dict[str, PythonOp]:
    """Every Python op the configured packages provide, by `domain::op_type`. A package that fails to import
    is logged and skipped (the agent keeps running; bundles needing its ops are refused, naming them)."""
    specs = _package_specs()
    points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    key = (*specs, *(p.name for p in points))
    with _CONFIG.lock:
        if key in _CONFIG.loaded:
            return _CONFIG.loaded[key]
    ops: dict[str, PythonOp] = {}
    sources: list[tuple[str, Callable[[], Any]]] = [(s, lambda s=s: _import(s)) for s in specs]  # type: ignore[misc]
    sources += [(f"entry point {p.name}", p.load) for p in points]
    for origin, load in sources:
        try:
            module = load()
            for op in _python_ops(module, origin):
                ops.setdefault(op.key, op)
        except Exception as err:  # a broken package disables its ops, never the agent
            log.error("custom-op package %s cannot be loaded: %s", origin, err)
    with _CONFIG.lock:
        _CONFIG.loaded[key] = ops
    return ops


@cache
def ort_native_ops() -> frozenset[tuple[str, str]]:
    """(domain, op) pairs in non-standard domains that this onnxruntime implements itself."""
    from onnxruntime.capi import _pybind_state

    kernels: list[Any] = getattr(_pybind_state, "get_all_opkernel_def", list)()
    return frozenset((k.domain, k.op_name) for k in kernels if k.domain not in _STANDARD)


def find_library(name: str) -> Path | None:
    for folder in _library_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


@dataclass(frozen=True)
class Resolution:
    """How each of a bundle's custom ops would run here, and which have no implementation."""

    native: tuple[str, ...] = ()
    python: tuple[PythonOp, ...] = ()
    libraries: tuple[Path, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)  # op key → what would provide it

    @property
    def ok(self) -> bool:
        return not self.missing


def resolve(ops: Iterable[CustomOp]) -> Resolution:
    """Match a bundle's custom ops with this device's implementations. Never raises."""
    native, python, libraries, missing = [], [], [], {}
    ops = list(ops)
    have = python_ops() if ops else {}

    def extensions() -> Any:  # imported only for ops that need it (it pulls in onnx, and torch when present)
        return optional_import("onnxruntime_extensions", package="onnxruntime-extensions", extra=EXTRA)

    for op in ops:
        if op.library:
            path = find_library(op.library)
            if path is None:
                dirs = [str(d) for d in _library_dirs()] or "none configured"
                missing[op.key] = f"library {op.library} (not in the custom-op library directories: {dirs})"
            elif path not in libraries:
                libraries.append(path)
        elif (op.domain, op.op_type) in ort_native_ops():
            native.append(op.key)
        elif op.key in have:
            if extensions().module is None:
                missing[op.key] = f"its Python op needs onnxruntime-extensions: {extensions().reason}"
            else:
                python.append(have[op.key])
        elif op.domain == CONTRIB_DOMAIN and extensions().module is not None:
            native.append(op.key)  # onnxruntime-extensions' own compiled ops; their registration checks them
        else:
            missing[op.key] = f"a custom-op package defining it (${ENV_VAR}) or a library (${LIBRARY_ENV_VAR})"
    return Resolution(tuple(native), tuple(python), tuple(libraries), missing)


def check(manifest: Manifest) -> None:
    """BundleError naming every custom op of the bundle that this device cannot run."""
    result = resolve(manifest.custom_ops)
    if not result.ok:
        listed = "; ".join(
            f"{key} (opset {next(op.version for op in manifest.custom_ops if op.key == key)}): needs {why}"
            for key, why in result.missing.items()
        )
        raise BundleError(f"the bundle needs custom operators this device lacks: {listed}")


@dataclass(frozen=True)
class Prepared:
    """What a backend loads for a bundle with custom ops: the model file and the libraries to register."""

    model_path: Path
    libraries: tuple[str, ...] = ()


def _register(ops: Sequence[PythonOp]) -> str:
    found = optional_import("onnxruntime_extensions", package="onnxruntime-extensions", extra=EXTRA)
    ext: Any = found.module
    if ext is None:
        raise BundleError(found.reason)
    with _CONFIG.lock:
        for op in ops:
            if op.contrib_name in _CONFIG.registered:
                continue
            try:
                kinds = [getattr(ext.PyOp, _PYOP_TYPES[t]) for t in op.inputs]
                outs = [getattr(ext.PyOp, _PYOP_TYPES[t]) for t in op.outputs]
                attrs = {k: getattr(ext.PyOp, _PYOP_TYPES[v]) for k, v in op.attributes.items()}
            except KeyError as err:
                raise BundleError(f"{op.key} from {op.origin}: unknown element type {err.args[0]!r}") from err
            ext.onnx_op(op_type=op.contrib_name, inputs=kinds, outputs=outs, attrs=attrs)(op.compute)
            _CONFIG.registered.add(op.contrib_name)
    return str(ext.get_library_path())


def _renamed(model_path: Path, ops: Sequence[PythonOp], work_dir: Path) -> Path:
    """A copy of the model whose Python-op nodes are addressed as onnxruntime-extensions registers them."""
    found = optional_import("onnx", package="onnx", extra=EXTRA)
    onnx: Any = found.module
    if onnx is None:
        raise BundleError(f"renaming custom-op domains for onnxruntime-extensions needs onnx: {found.reason}")
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()[:16]
    target = work_dir / f"{digest}-{'-'.join(sorted(op.contrib_name for op in ops))}.onnx"
    if target.is_file():
        return target
    model = onnx.load(str(model_path))
    by_key = {op.key: op for op in ops}

    def graphs(graph: Any) -> Iterable[Any]:
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from graphs(sub)

    for graph in graphs(model.graph):
        for node in graph.node:
            op = by_key.get(f"{node.domain}::{node.op_type}")
            if op is not None:
                node.domain, node.op_type = CONTRIB_DOMAIN, op.contrib_name
    domains = {op.domain for op in ops}
    kept = [imp for imp in model.opset_import if imp.domain not in domains]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    if not any(imp.domain == CONTRIB_DOMAIN for imp in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1))
    work_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    onnx.save(model, str(partial))
    partial.replace(target)
    return target


def prepare(model_path: Path, manifest: Manifest, work_dir: Path) -> Prepared:
    """The model file and custom-op libraries a session needs (the model as is when it holds no custom op)."""
    if not manifest.custom_ops:
        return Prepared(model_path)
    result = resolve(manifest.custom_ops)
    if not result.ok:
        check(manifest)
    libraries = [str(p) for p in result.libraries]
    if result.python:
        libraries.insert(0, _register(result.python))
        model_path = _renamed(model_path, result.python, work_dir)
    elif any(op.domain == CONTRIB_DOMAIN for op in manifest.custom_ops):
        libraries.insert(0, _register([]))
    return Prepared(model_path, tuple(dict.fromkeys(libraries)))


def summary() -> dict[str, str]:
    """What this agent can run, for logs and status: op key → where its implementation comes from."""
    return {key: f"python ({op.origin})" for key, op in python_ops().items()}


__all__ = ["Prepared", "PythonOp", "Resolution", "check", "configure", "prepare", "python_ops", "resolve", "summary"]
