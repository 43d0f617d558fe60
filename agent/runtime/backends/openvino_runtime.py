"""The OpenVINO runtime on CPU, GPU, NPU or AUTO. Reads ONNX directly and OpenVINO IR (.xml + .bin).

Settings: the LATENCY performance hint (one stream, all cores on one request), `CACHE_DIR` under the
agent's cache folder (GPU/NPU compilation takes seconds; the blob is reused at the next start), and for
FP32 bundles `INFERENCE_PRECISION_HINT=f32`, because OpenVINO's CPU plugin runs bf16 by default on CPUs
with AVX-512 BF16 or AMX, which would move outputs out of an FP32 bundle's golden tolerance.
`openvino` is an optional dependency (`pip install 'edgefleet[openvino]'`), imported on first use.
"""

from __future__ import annotations

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
    SessionPool,
    distribution_version,
    optional_import,
    register,
)

PREFIX = "openvino:"
_HINTS = {
    "GPU": "an Intel GPU with its compute runtime (intel-opencl-icd, /dev/dri/renderD*)",
    "NPU": "an Intel NPU (Core Ultra) with its driver (/dev/accel/accel*)",
}


class _Runtime:
    """One ov.Core per process, created on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.core: Any = None
        self.module: Any = None
        self.reason = ""

    def get(self) -> tuple[Any, str]:
        with self.lock:
            if self.core is None and not self.reason:
                found = optional_import("openvino", package="openvino", extra="openvino")
                if found.module is None:
                    self.reason = found.reason
                else:
                    try:
                        self.module, self.core = found.module, found.module.Core()
                    except Exception as err:  # a broken plugin install, for example
                        self.reason = f"openvino {distribution_version('openvino')} cannot start: {err}"
            return self.core, self.reason


_RUNTIME = _Runtime()


@register
class OpenVINOBackend(Backend):
    key = "openvino"
    title = "OpenVINO runtime"
    formats = ("onnx", "openvino-ir")
    known_providers = ("openvino:CPU", "openvino:GPU", "openvino:NPU", "openvino:AUTO")

    def claims(self, provider: str) -> bool:
        return provider.startswith(PREFIX) and len(provider) > len(PREFIX)

    def availability(self, provider: str) -> Availability:
        core, reason = _RUNTIME.get()
        if core is None:
            return Availability.no(reason)
        device = provider.removeprefix(PREFIX)
        devices: list[str] = list(core.available_devices)
        if device in ("AUTO", "MULTI", "HETERO"):
            return (
                Availability.yes(f"{device} over {', '.join(devices)}")
                if devices
                else Availability.no(f"openvino {self._version()} sees no device for {device}")
            )
        family = device.split(".")[0]
        if device in devices or (device == family and any(d.split(".")[0] == family for d in devices)):
            return Availability.yes(str(core.get_property(device, "FULL_DEVICE_NAME")))
        needs = _HINTS.get(family, "a device of that name")
        return Availability.no(f"openvino {self._version()} sees only {', '.join(devices) or 'no device'}; {needs}")

    def version(self, provider: str) -> str:
        return f"openvino {self._version()}"

    @staticmethod
    def _version() -> str:
        return distribution_version("openvino") or "(not installed)"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        core, reason = _RUNTIME.get()
        if core is None:
            raise LoadError(reason)
        device = provider.removeprefix(PREFIX)
        config = compile_config(core, device, options)
        try:
            # A path (not a read model) lets CACHE_DIR skip reading and compiling when the blob is cached.
            compiled = core.compile_model(str(model_path), device, config)
        except Exception as err:  # OpenVINO raises RuntimeError subclasses with the plugin's message
            raise LoadError(f"openvino cannot compile the model for {device}: {err}") from err
        return OpenVINOSession(compiled, provider, options.outputs)


def compile_config(core: Any, device: str, options: LoadOptions) -> dict[str, Any]:
    """The properties given to compile_model: only those the device supports."""
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if options.cache_dir is not None:
        folder = options.cache_dir / "openvino"
        folder.mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = str(folder)
    per_device: dict[str, Any] = {}
    if options.float_f32:
        per_device["INFERENCE_PRECISION_HINT"] = "f32"
    if options.threads:
        per_device["INFERENCE_NUM_THREADS"] = options.threads
    if device in ("AUTO", "MULTI", "HETERO"):
        if per_device:  # AUTO forwards per-device properties; only the CPU has these two
            config["DEVICE_PROPERTIES"] = {"CPU": per_device}
        return config
    supported = set(core.get_property(device, "SUPPORTED_PROPERTIES"))
    config.update({k: v for k, v in per_device.items() if k in supported})
    return config


class OpenVINOSession(Session):
    """Each concurrent caller takes its own infer request from a pool (an infer request is not thread-safe)."""

    def __init__(self, compiled: Any, provider: str, outputs: tuple[str, ...]) -> None:
        self._compiled = compiled
        self.provider = provider
        self._ports: list[tuple[str, Any]] = []
        for port in compiled.outputs:
            names = port.get_names()
            wanted = [n for n in outputs if n in names]
            self._ports.append((wanted[0] if wanted else port.get_any_name(), port))
        if outputs:
            order = {name: i for i, name in enumerate(outputs)}
            self._ports.sort(key=lambda item: order.get(item[0], len(order)))
        self.output_names = [name for name, _ in self._ports]
        self._requests = SessionPool(compiled.create_infer_request)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        request = self._requests.take()
        try:
            result = request.infer(dict(feeds), share_inputs=True)  # outputs are copied (share_outputs=False)
            return {name: result[port] for name, port in self._ports}
        finally:
            self._requests.give(request)

    def describe(self) -> dict[str, str]:
        described: dict[str, str] = {}
        for key in ("EXECUTION_DEVICES", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "NUM_STREAMS"):
            try:
                described[key] = str(self._compiled.get_property(key))
            except Exception:  # AUTO does not expose every property
                continue
        return described

    def close(self) -> None:
        self._requests = SessionPool(lambda: None)
        del self._compiled
