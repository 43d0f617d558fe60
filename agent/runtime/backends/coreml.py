"""CoreML through coremltools (macOS only): `coreml:ALL`, `coreml:CPU_ONLY`, `coreml:CPU_AND_GPU`, `coreml:CPU_AND_NE`.

coremltools installs on Linux and converts there, but prediction needs the CoreML framework, so on
any other system the backend reports itself unavailable and never imports coremltools. (CoreML through
ONNX Runtime is `CoreMLExecutionProvider`, handled by the ONNX Runtime backend.)
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.runtime.backends import (
    Availability,
    Backend,
    CancelToken,
    LoadError,
    LoadOptions,
    Session,
    distribution_version,
    optional_import,
    register,
)

PREFIX = "coreml:"
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


@register
class CoreMLBackend(Backend):
    key = "coreml"
    title = "CoreML"
    formats = ("coreml",)
    known_providers = tuple(PREFIX + unit for unit in COMPUTE_UNITS)

    def claims(self, provider: str) -> bool:
        return provider.startswith(PREFIX)

    def availability(self, provider: str) -> Availability:
        units = provider.removeprefix(PREFIX)
        if units not in COMPUTE_UNITS:
            return Availability.no(f"unknown CoreML compute units {units!r}; valid: {', '.join(COMPUTE_UNITS)}")
        if platform.system() != "Darwin":
            return Availability.no(
                f"CoreML runs only on macOS (this is {platform.system().lower()}); coremltools here could convert "
                "models but not run them"
            )
        found = optional_import("coremltools", package="coremltools", extra="coreml")
        if found.module is None:
            return Availability.no(found.reason)
        return Availability.yes(f"coremltools {distribution_version('coremltools')} on macOS {platform.mac_ver()[0]}")

    def version(self, provider: str) -> str:
        return f"coremltools {distribution_version('coremltools') or '(not installed)'}"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        available = self.availability(provider)
        if not available.ok:
            raise LoadError(available.reason)
        ct: Any = optional_import("coremltools", package="coremltools", extra="coreml").module
        units = getattr(ct.ComputeUnit, provider.removeprefix(PREFIX))
        try:
            model = ct.models.MLModel(str(model_path), compute_units=units)
        except Exception as err:  # coremltools raises a mix of RuntimeError and ValueError
            raise LoadError(f"coremltools cannot load the model: {err}") from err
        return CoreMLSession(model, provider, options.outputs)


class CoreMLSession(Session):
    def __init__(self, model: Any, provider: str, outputs: tuple[str, ...]) -> None:
        self._model = model
        self.provider = provider
        self.output_names = list(outputs) or [o.name for o in model.get_spec().description.output]
        self._lock = threading.Lock()  # MLModel.predict is not documented as thread-safe

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            result = self._model.predict(dict(feeds))
        return {name: np.asarray(result[name]) for name in self.output_names}
