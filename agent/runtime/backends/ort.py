"""ONNX Runtime: CPU, CUDA, TensorRT, OpenVINO (EP plugin or an ORT build with it) and CoreML EPs.

Provider names are ORT's own EP names. A session is refused when ORT silently put the graph on another
EP than the one asked for (ORT only warns when a provider is missing and falls back to CPU). Custom-op
libraries named in the load options are registered first. TensorRT engines are built at the first load and
cached per model, TensorRT version and GPU architecture (backends/tensorrt_engines.py).
"""

from __future__ import annotations

import json
import logging
import platform
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

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
from edgefleet.agent.runtime.backends import tensorrt_engines as engines

log = logging.getLogger(__name__)

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
OPENVINO, COREML = "OpenVINOExecutionProvider", "CoreMLExecutionProvider"
_PLUGIN_PACKAGE = "onnxruntime-ep-openvino"  # ORT >= 1.23 plugin EP, installed beside onnxruntime
_PLUGIN_REGISTRATION = "edgefleet-openvino-ep"
_INTEL_VENDOR_ID = 0x8086

_NEEDS = {
    CUDA: "the onnxruntime-gpu package (instead of onnxruntime), an NVIDIA GPU and the CUDA 12 + cuDNN 9 libraries",
    TENSORRT: "the onnxruntime-gpu package built with TensorRT, an NVIDIA GPU and the TensorRT 10 libraries",
    COREML: "an onnxruntime build for macOS (the PyPI wheels for macOS include it)",
}


def _gpu_note() -> str:
    return "" if Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl").exists() else "; no NVIDIA GPU is visible"


class _PluginState:
    """The OpenVINO EP plugin is registered once per process (registration loads its own libopenvino)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked = False
        self.devices: list[Any] = []
        self.reason = ""


_PLUGIN = _PluginState()


def _openvino_plugin() -> tuple[list[Any], str]:
    """(the plugin's OrtEpDevices for this machine, why there are none)."""
    with _PLUGIN.lock:
        if _PLUGIN.checked:
            return _PLUGIN.devices, _PLUGIN.reason
        _PLUGIN.checked = True
        found = optional_import("onnxruntime_ep_openvino", package=_PLUGIN_PACKAGE)
        if found.module is None:
            _PLUGIN.reason = f"{found.reason} (it needs onnxruntime >= 1.23)"
            return [], _PLUGIN.reason
        try:
            ort.register_execution_provider_library(_PLUGIN_REGISTRATION, found.module.get_library_path())
            every = list(ort.get_ep_devices())
        except Exception as err:  # a plugin built for another ORT ABI fails here
            _PLUGIN.reason = f"{_PLUGIN_PACKAGE} {distribution_version(_PLUGIN_PACKAGE)} does not register: {err}"
            return [], _PLUGIN.reason
        _PLUGIN.devices = [d for d in every if d.ep_name == OPENVINO]
        if not _PLUGIN.devices:
            seen = ", ".join(
                f"{d.device.type.name} {d.device.vendor or '?'} (vendor 0x{d.device.vendor_id:04x})" for d in every
            )
            _PLUGIN.reason = (
                f"{_PLUGIN_PACKAGE} {distribution_version(_PLUGIN_PACKAGE)} is registered but offers no device: "
                f"it claims only Intel hardware (vendor 0x{_INTEL_VENDOR_ID:04x}); this machine has {seen or 'none'}"
            )
        return _PLUGIN.devices, _PLUGIN.reason


@register
class OnnxRuntimeBackend(Backend):
    key = "onnxruntime"
    title = "ONNX Runtime"
    formats = ("onnx", "onnx-tensorrt")
    known_providers = (CPU, CUDA, TENSORRT, OPENVINO, COREML)
    hosts_custom_ops = True  # registered libraries; their nodes run on the CPU EP inside any session

    def claims(self, provider: str) -> bool:
        return provider.endswith("ExecutionProvider") and ":" not in provider

    def availability(self, provider: str) -> Availability:
        built_in = ort.get_available_providers()
        if provider == OPENVINO and provider not in built_in:
            devices, reason = _openvino_plugin()
            if not devices:
                return Availability.no(reason)
            names = ", ".join(str(d.ep_metadata.get("ov_device", "?")) for d in devices)
            return Availability.yes(f"{_PLUGIN_PACKAGE} plugin, devices {names}")
        if provider in built_in:
            return Availability.yes(f"onnxruntime {ort.__version__}")
        have = ", ".join(p.removesuffix("ExecutionProvider") for p in built_in)
        needs = _NEEDS.get(provider, "an onnxruntime build that includes it")
        extra = _gpu_note() if provider in (CUDA, TENSORRT) else ""
        if provider == COREML and platform.system() != "Darwin":
            extra = f"; CoreML exists only on Apple platforms (this is {platform.system().lower()})"
        return Availability.no(f"onnxruntime {ort.__version__} here has only {have}; {provider} needs {needs}{extra}")

    def version(self, provider: str) -> str:
        text = f"onnxruntime {ort.__version__}"
        if provider == OPENVINO and provider not in ort.get_available_providers():
            plugin = distribution_version(_PLUGIN_PACKAGE)
            text += f" + {_PLUGIN_PACKAGE} {plugin}" if plugin else f" (no {_PLUGIN_PACKAGE})"
        if provider == TENSORRT and provider in ort.get_available_providers():
            text += f" + TensorRT {engines.tensorrt_version()}"  # an upgrade measures (and builds) again
        return text

    def compiles_on_load(self, provider: str, options: LoadOptions) -> bool:
        return provider == TENSORRT and not engines.has_engine(options)

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        so = ort.SessionOptions()
        so.intra_op_num_threads = options.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # No spinning between runs: ONNX Runtime's intra-op workers otherwise spin after every run, and an idle
        # agent's golden-set probe (2 a second while quiet) kept one worker at 11 % of a core; without it 0.1 %
        # (docs/agent.md, bench/idle.py). Back-to-back runs on a shared 2-core machine were no slower without it.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        cancel.on_cancel(lambda: so.set_load_cancellation_flag(True))
        for library in options.custom_op_libraries:
            try:
                so.register_custom_ops_library(library)
            except Exception as err:  # a library built for another ORT ABI, or not a library at all
                raise LoadError(f"cannot register custom-op library {library}: {err}") from err
        if provider == TENSORRT:
            engines.prepare_engine_dir(options)
        if provider == OPENVINO and provider not in ort.get_available_providers():
            devices, reason = _openvino_plugin()
            cpu = [d for d in devices if d.ep_metadata.get("ov_device") == "CPU"] or devices
            if not cpu:
                raise LoadError(reason)
            so.add_provider_for_devices(cpu[:1], provider_options(provider, options, plugin=True))
            providers: list[Any] | None = None
        else:
            providers = [(provider, provider_options(provider, options))]
            if provider == TENSORRT:  # nodes TensorRT cannot take run on CUDA, not on the CPU
                providers.append((CUDA, provider_options(CUDA, options)))
        try:
            session = ort.InferenceSession(str(model_path), so, providers=providers)
        except Exception as err:  # onnxruntime raises its own untyped exceptions
            raise LoadError(f"onnxruntime cannot load the model on {provider}: {err}") from err
        used = session.get_providers()
        if not used or used[0] != provider:
            raise LoadError(f"onnxruntime put the model on {used} instead of {provider}")
        return OrtSession(session, provider, options.outputs)


def provider_options(provider: str, options: LoadOptions, *, plugin: bool = False) -> dict[str, str]:
    """The EP options edgefleet uses; every value a string, as ORT's C API wants."""
    cache = options.cache_dir
    if provider == CUDA:
        return {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"}  # EXHAUSTIVE can take minutes at load
    if provider == TENSORRT:
        return engines.session_options(options)
    if provider == OPENVINO:
        hints: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
        if options.float_f32:
            hints["INFERENCE_PRECISION_HINT"] = "f32"  # OpenVINO's CPU default is bf16 where the CPU has it
        result = {"load_config": json.dumps({"CPU": hints})}
        if not plugin:
            result["device_type"] = "CPU"
        if options.threads:
            result["num_of_threads"] = str(options.threads)
        if cache:
            result["cache_dir"] = str(cache / "ort-openvino")
        return result
    if provider == COREML:
        result = {"ModelFormat": "MLProgram", "MLComputeUnits": "ALL"}
        if cache:
            result["ModelCacheDirectory"] = str(cache / "ort-coreml")
        return result
    return {}


class OrtSession(Session):
    def __init__(self, session: ort.InferenceSession, provider: str, outputs: tuple[str, ...]) -> None:
        self._session = session
        self.provider = provider
        present = [o.name for o in session.get_outputs()]
        self.output_names = [o for o in outputs if o in present] if outputs else present
        # InferenceSession.run re-checks input names on every call (about 1 µs, 5% of a small model); the
        # caller has validated the feeds already, so call the binding below it when this ORT version has it.
        binding: Any = getattr(session, "_sess", None)
        self._call: Any = binding.run if callable(getattr(binding, "run", None)) else None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Both calls are thread-safe; no lock, so concurrent callers overlap.
        names = self.output_names
        if self._call is not None:
            return dict(zip(names, self._call(names, feeds, None), strict=True))
        return dict(zip(names, self._session.run(names, feeds), strict=True))

    def describe(self) -> dict[str, str]:
        options = self._session.get_provider_options().get(self.provider, {})
        return {"providers": ",".join(self._session.get_providers()), **options}

    def close(self) -> None:
        del self._session
