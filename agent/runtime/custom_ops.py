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

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgefleet.agent.runtime import native_code
from edgefleet.agent.runtime.backends import optional_import
from edgefleet.core.bundle.manifest import CustomOp, Manifest
from edgefleet.core.custom_ops import packages
from edgefleet.core.custom_ops.packages import (
    CONTRIB_DOMAIN,
    ENV_VAR,
    LIBRARY_ENV_VAR,
    CustomOpPackageError,
    OpDefinition,
    ort_native_ops,
)
from edgefleet.core.custom_ops.renamed_copy import renamed_copy
from edgefleet.core.errors import BundleError

EXTRA = "custom-ops"
PythonOp = OpDefinition  # a definition with a numpy `compute`


@dataclass
class _Config:
    packages: list[str] = field(default_factory=list)  # set by configure(); added to $EDGEFLEET_CUSTOM_OPS
    library_dirs: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_CONFIG = _Config()


def configure(packages: Sequence[str] = (), library_dirs: Sequence[Path] = ()) -> None:
    """Custom-op packages and library directories given on the command line (beside the environment's)."""
    with _CONFIG.lock:
        _CONFIG.packages = list(packages)
        _CONFIG.library_dirs = list(library_dirs)


def configuration() -> tuple[list[str], list[Path]]:
    """The packages and library directories given by `configure` (a measuring worker is configured the same)."""
    with _CONFIG.lock:
        return list(_CONFIG.packages), list(_CONFIG.library_dirs)


def python_ops() -> dict[str, PythonOp]:
    """Every Python op the configured packages provide, by `domain::op_type`. A package that fails to import
    is logged and skipped (the agent keeps running; bundles needing its ops are refused, naming them)."""
    found = packages.load_definitions(_CONFIG.packages, strict=False)
    return {key: op for key, op in found.items() if op.compute is not None}


def find_library(name: str) -> Path | None:
    return packages.find_library(name, _CONFIG.library_dirs)


def _library_dirs() -> list[Path]:
    return packages.library_dirs(_CONFIG.library_dirs)


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
    if found.module is None:
        raise BundleError(found.reason)
    try:
        return packages.register_python_ops(ops, found.module)
    except CustomOpPackageError as err:
        raise BundleError(str(err)) from err


def _renamed(model_path: Path, ops: Sequence[PythonOp], work_dir: Path) -> Path:
    """A copy of the model whose Python-op nodes are addressed as onnxruntime-extensions registers them, its
    external data files beside it (edgefleet/core/custom_ops/renamed_copy.py)."""
    found = optional_import("onnx", package="onnx", extra=EXTRA)
    onnx: Any = found.module
    if onnx is None:
        raise BundleError(f"renaming custom-op domains for onnxruntime-extensions needs onnx: {found.reason}")
    try:
        return renamed_copy(onnx, model_path, [op.key for op in ops], work_dir)
    except CustomOpPackageError as err:
        raise BundleError(str(err)) from err


def prepare(model_path: Path, manifest: Manifest, work_dir: Path) -> Prepared:
    """The model file and custom-op libraries a session needs (the model as is when it holds no custom op). Each
    library is recorded as native code the agent loads (agent/runtime/native_code.py: logged, in the status)."""
    if not manifest.custom_ops:
        return Prepared(model_path)
    result = resolve(manifest.custom_ops)
    if not result.ok:
        check(manifest)
    libraries = [str(p) for p in result.libraries]
    origins = dict.fromkeys(libraries, "custom-op library from the device's --custom-op-libs folders")
    extensions = ""
    if result.python:
        extensions = _register(result.python)
        model_path = _renamed(model_path, result.python, work_dir)
    elif any(op.domain == CONTRIB_DOMAIN for op in manifest.custom_ops):
        extensions = _register([])
    if extensions:
        libraries.insert(0, extensions)
        origins = {extensions: "onnxruntime-extensions (the device's custom-op packages)", **origins}
    for library, origin in origins.items():
        native_code.record(library, origin, manifest.bundle_id)
    return Prepared(model_path, tuple(dict.fromkeys(libraries)))


def summary() -> dict[str, str]:
    """What this agent can run, for logs and status: op key → where its implementation comes from."""
    return {key: f"python ({op.origin})" for key, op in python_ops().items()}


__all__ = ["Prepared", "PythonOp", "Resolution", "check", "configure", "prepare", "python_ops", "resolve", "summary"]
