"""Runtime backends: one file per runtime, behind one small interface.

A backend has a key, claims the provider names it understands, says whether a provider is available on
this machine (and why not), loads a bundle's model for one provider, and reports its runtime version.
Every module in this package is imported by `backends()`; a module registers its backend with
`@register`, so a new runtime is one new file. Optional runtimes (OpenVINO, coremltools, the ORT
OpenVINO EP plugin) are imported only when a provider that needs them is asked about, through
`optional_import`, whose failure disables the backend with a reason naming the pip extra; it never
raises at import time, and `import edgefleet.agent.runtime` loads none of them. Backends outside this package
are plugins: Python files or modules named in $EDGEFLEET_BACKENDS (separated by the OS path separator), imported
by `backends()` in the agent and in its measuring workers alike, each registering itself with `@register`.

Provider names, as manifests and profiles write them:
  "CPUExecutionProvider", "CUDAExecutionProvider", ...   ONNX Runtime with that execution provider
  "openvino:CPU", "openvino:GPU", "openvino:NPU", ...    the OpenVINO runtime on that device
  "coreml:ALL", "coreml:CPU_AND_NE", ...                 CoreML (macOS) with those compute units
  "web:wasm", "web:webgpu"                               onnxruntime-web in a browser (never in this agent)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import pkgutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from edgefleet.core.bundle.manifest import TensorRTOptions
from edgefleet.core.errors import BundleError, UnknownNameError

log = logging.getLogger(__name__)


class LoadError(BundleError):
    """A backend could not load a model for a provider (the provider is then skipped, with this reason)."""


@dataclass(frozen=True)
class Availability:
    """Whether a provider can run here; `reason` says why not (or, when available, what it runs on)."""

    ok: bool
    reason: str

    @classmethod
    def yes(cls, detail: str = "") -> Availability:
        return cls(True, detail)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


@dataclass(frozen=True)
class LoadOptions:
    """How to load: the same for every backend; each maps it onto its own session options."""

    threads: int = 0  # 0 lets the runtime decide
    precision: str = "fp32"  # the bundle's recipe precision; fp32 bundles ask runtimes not to downcast
    pin_f32: bool = False  # the converter measured it with OpenVINO's f32 hint (also INT8 with float layers)
    cache_dir: Path | None = None  # compiled blobs and engines go under here (one folder per backend)
    outputs: tuple[str, ...] = ()  # the manifest's output names, in order
    model_sha256: str = ""  # the bundle's model artifact (keys compiled engines); "" for a bare model file
    bundle_dir: Path | None = None  # the unpacked bundle (files the options name, e.g. a calibration table)
    tensorrt: TensorRTOptions | None = None  # the bundle's TensorRT EP options
    custom_op_libraries: tuple[str, ...] = ()  # custom-op libraries to register before loading
    runtime_config: Mapping[str, str | int] = field(default_factory=dict)  # generative: the manifest's properties

    @property
    def float_f32(self) -> bool:
        """Float layers must run in f32, as the converter measured them (OpenVINO's CPU default is bf16)."""
        return self.precision == "fp32" or self.pin_f32


class CancelToken:
    """Set when a load took too long: backends that can abort a load register how (ORT can; OpenVINO cannot)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], object]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def on_cancel(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return
        callback()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled, callbacks, self._callbacks = True, self._callbacks, []
        for callback in callbacks:
            with contextlib.suppress(Exception):  # a failed cancellation leaves the load running
                callback()


class Session(ABC):
    """A model loaded for one provider. `run` must be safe to call from several threads at once."""

    provider: str
    output_names: list[str]

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Unvalidated inference (the caller checked names, dtypes and shapes)."""

    def describe(self) -> dict[str, str]:
        """Settings the runtime really applied (for logs, status and tests)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional for backends that hold nothing to release
        """Release the runtime's resources; the session must not be used afterwards."""


class Backend(ABC):
    key: ClassVar[str]  # e.g. "onnxruntime"
    title: ClassVar[str]  # e.g. "ONNX Runtime"
    formats: ClassVar[tuple[str, ...]]  # bundle formats it can load
    known_providers: ClassVar[tuple[str, ...]]  # the provider names it documents (others may be claimed too)
    hosts_custom_ops: ClassVar[bool] = False  # can register custom-op implementations (LoadOptions)

    @abstractmethod
    def claims(self, provider: str) -> bool:
        """Whether `provider` is a name this backend runs (whether or not it is available here)."""

    @abstractmethod
    def availability(self, provider: str) -> Availability:
        """Can `provider` run on this machine, and if not, why not. Never raises."""

    @abstractmethod
    def version(self, provider: str) -> str:
        """The runtime (and plugin) versions that `provider` would use; cheap (no heavy import)."""

    @abstractmethod
    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        """Load `model_path` for `provider`; raise LoadError with the runtime's reason when it cannot."""

    def compiles_on_load(self, provider: str, options: LoadOptions) -> bool:
        """Whether this load will compile something slow that is not cached yet (a TensorRT engine): the
        selection then allows the engine build its own, longer time limit."""
        return False


_REGISTRY: dict[str, Backend] = {}
_REGISTRY_LOCK = threading.Lock()
_DISCOVERED = False


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make a backend known (one instance per process: backends may hold runtimes)."""
    with _REGISTRY_LOCK:
        if cls.key in _REGISTRY and type(_REGISTRY[cls.key]) is not cls:
            raise ValueError(f"backend key {cls.key!r} is already registered by {type(_REGISTRY[cls.key]).__name__}")
        _REGISTRY.setdefault(cls.key, cls())
    return cls


PLUGINS_ENV = "EDGEFLEET_BACKENDS"


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    for spec in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        try:
            _import_plugin(spec)
        except Exception as err:  # a broken plugin disables its backend, never the agent
            log.error("backend plugin %s (from $%s) cannot be loaded: %s", spec, PLUGINS_ENV, err)
    _DISCOVERED = True


def _import_plugin(spec: str) -> None:
    path = Path(spec)
    if path.suffix != ".py":
        importlib.import_module(spec)
        return
    loader = importlib.util.spec_from_file_location(f"edgefleet_backend_plugin_{path.stem}", path)
    if loader is None or loader.loader is None or not path.is_file():
        raise ImportError(f"{spec} is not a readable Python file")
    loader.loader.exec_module(importlib.util.module_from_spec(loader))


def backends() -> list[Backend]:
    """Every registered backend (importing this package's modules imports no optional runtime)."""
    _discover()
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def backend_for(provider: str) -> Backend:
    """The backend that runs `provider`; UnknownNameError lists the provider names that exist."""
    for backend in backends():
        if backend.claims(provider):
            return backend
    raise UnknownNameError("provider", provider, [p for b in backends() for p in b.known_providers])


def misfit(provider: str, bundle_format: str, *, custom_ops: Sequence[str] = ()) -> Availability | None:
    """Why `provider` can never run a bundle of `bundle_format` (holding `custom_ops`), decided from the backend's
    declared formats alone, without probing or importing its runtime; None when it may run here."""
    try:
        backend = backend_for(provider)
    except UnknownNameError as err:
        return Availability.no(str(err))
    if bundle_format not in backend.formats:
        return Availability.no(
            f"{backend.title} cannot load {bundle_format} bundles (it loads {', '.join(backend.formats)})"
        )
    if custom_ops and not backend.hosts_custom_ops:
        return Availability.no(f"{backend.title} cannot load custom operators ({', '.join(custom_ops)})")
    return None


def availability(provider: str, bundle_format: str, *, custom_ops: Sequence[str] = ()) -> Availability:
    """Whether `provider` can run a bundle of `bundle_format` (holding `custom_ops`) here. Never raises."""
    unfit = misfit(provider, bundle_format, custom_ops=custom_ops)
    if unfit is not None:
        return unfit
    backend = backend_for(provider)
    try:
        return backend.availability(provider)
    except Exception as err:  # a probe that breaks disables the provider, it never takes the agent down
        return Availability.no(f"{backend.title} availability check failed: {type(err).__name__}: {err}")


def runtime_versions(providers: Sequence[str]) -> dict[str, str]:
    """provider -> the versions of what would run it ("unknown provider" for names nobody claims)."""
    versions: dict[str, str] = {}
    for provider in providers:
        try:
            versions[provider] = backend_for(provider).version(provider)
        except UnknownNameError:
            versions[provider] = "unknown provider"
    return versions


@contextmanager
def registered(backend: Backend) -> Iterator[Backend]:
    """Register a backend for the duration of a block (tests register fault-injecting backends this way)."""
    _discover()
    with _REGISTRY_LOCK:
        if backend.key in _REGISTRY:
            raise ValueError(f"backend key {backend.key!r} is already registered")
        _REGISTRY[backend.key] = backend
    try:
        yield backend
    finally:
        with _REGISTRY_LOCK:
            _REGISTRY.pop(backend.key, None)


@dataclass(frozen=True)
class OptionalModule:
    """The outcome of a guarded import: the module, or why it is missing and which extra installs it."""

    module: ModuleType | None
    reason: str = ""
    extra: str = ""


_IMPORTS: dict[str, OptionalModule] = {}


def optional_import(name: str, *, package: str, extra: str | None = None) -> OptionalModule:
    """Import an optional runtime once; a failure is remembered as a reason, never raised."""
    cached = _IMPORTS.get(name)
    if cached is not None:
        return cached
    install = f"pip install 'edgefleet[{extra}]'" if extra else f"pip install {package}"
    try:
        found = OptionalModule(importlib.import_module(name))
    except ImportError as err:
        found = OptionalModule(None, f"{package} is not installed ({install}): {err}", extra or package)
    except Exception as err:  # a broken install (missing shared library, ABI clash) is reported the same way
        found = OptionalModule(None, f"{package} is installed but fails to import ({install}): {err}", extra or "")
    _IMPORTS[name] = found
    return found


def distribution_version(package: str) -> str | None:
    """An installed distribution's version from its metadata, without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class SessionPool:
    """Idle per-call state (e.g. OpenVINO infer requests) shared by threads: one per concurrent caller."""

    factory: Any
    _idle: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.factory()

    def give(self, item: Any) -> None:
        with self._lock:
            self._idle.append(item)


__all__ = [
    "Availability",
    "Backend",
    "CancelToken",
    "LoadError",
    "LoadOptions",
    "OptionalModule",
    "Session",
    "SessionPool",
    "availability",
    "backend_for",
    "backends",
    "distribution_version",
    "misfit",
    "optional_import",
    "register",
    "registered",
    "runtime_versions",
]
