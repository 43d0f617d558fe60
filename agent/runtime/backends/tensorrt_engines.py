"""TensorRT engine cache for the ONNX Runtime backend (registers no backend of its own).

A TensorRT engine is valid for one model, one TensorRT version and one GPU architecture. The bundle carries
portable ONNX plus the EP options (manifest `tensorrt`); the TensorRT EP builds the engine at the first load and
writes it under `trt_engine_cache_path`. That path is `CACHE/tensorrt/<key>/`, where the key hashes the model's
sha256, the options that shape the engine (FP16, INT8 and its calibration table), the TensorRT version and the
GPU's compute capability: a later start with the same key finds the engine and skips the build, and any change
(a new model, a TensorRT upgrade, another GPU) lands in a new folder, so the engine is rebuilt, never reused
wrongly. The INT8 calibration table is copied into the engine folder because the EP reads
`trt_int8_calibration_table_name` relative to the engine cache path. Timing caches (per TensorRT version and
architecture, shared by models) speed up rebuilds.

Probing never needs the GPU stack to be importable: TensorRT's version comes from package metadata or
`getInferLibVersion()` in libnvinfer, the architecture from the CUDA driver API (libcuda).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from edgefleet.agent.runtime.backends import LoadOptions, distribution_version

log = logging.getLogger(__name__)

ENGINE_SUFFIXES = (".engine",)
KEEP_ENGINE_DIRS = 8  # older key folders are removed beyond this many
_TRT_PACKAGES = ("tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-libs", "tensorrt-cu13")
_NVINFER = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")
_CUDA_DRIVER = ("libcuda.so.1", "libcuda.so")
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


@dataclass(frozen=True)
class Hardware:
    """What an engine depends on besides the model: TensorRT's version and the GPU architecture."""

    tensorrt: str  # e.g. "10.3.0", or "unknown"
    gpu_arch: str  # e.g. "sm_87" (Orin), or "unknown"


@cache
def tensorrt_version() -> str:
    for package in _TRT_PACKAGES:
        found = distribution_version(package)
        if found:
            return found
    for name in _NVINFER:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        code = int(library.getInferLibVersion())
        # TensorRT 10 encodes major*10000 + minor*100 + patch; TensorRT 8 major*1000 + minor*100 + patch.
        major, rest = (code // 10000, code % 10000) if code >= 100000 else (code // 1000, code % 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return "unknown"


@cache
def gpu_architecture(device: int = 0) -> str:
    for name in _CUDA_DRIVER:
        try:
            cuda = ctypes.CDLL(name)
        except OSError:
            continue
        handle, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(handle), device) != 0:
            return "unknown"
        cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, handle)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, handle)
        return f"sm_{major.value}{minor.value}"
    return "unknown"


def probe_hardware() -> Hardware:
    return Hardware(tensorrt_version(), gpu_architecture())


def engine_key(options: LoadOptions, hardware: Hardware) -> tuple[str, dict[str, object]]:
    """(the folder name, what it hashes)."""
    trt = options.tensorrt
    parts: dict[str, object] = {
        "model_sha256": options.model_sha256,
        "fp16": trt.fp16 if trt else options.precision == "fp16",
        "int8": trt.int8 if trt else options.precision.startswith("int8"),
        "calibration_sha256": _calibration_sha(options),
        "tensorrt": hardware.tensorrt,
        "gpu_arch": hardware.gpu_arch,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    return f"{hardware.gpu_arch}-trt{hardware.tensorrt}-{digest}", parts


def _calibration(options: LoadOptions) -> Path | None:
    trt = options.tensorrt
    if trt is None or not trt.int8 or not trt.calibration_table or options.bundle_dir is None:
        return None
    return options.bundle_dir.joinpath(*trt.calibration_table.split("/"))


def _calibration_sha(options: LoadOptions) -> str:
    table = _calibration(options)
    return hashlib.sha256(table.read_bytes()).hexdigest() if table and table.is_file() else ""


def engine_dir(options: LoadOptions, hardware: Hardware | None = None) -> Path | None:
    """Where this model's engines live (None without a cache folder)."""
    if options.cache_dir is None:
        return None
    root = options.cache_dir / "tensorrt"
    if not options.model_sha256:
        return root  # no model identity (a bare model file): ORT's own engine names keep models apart
    name, _ = engine_key(options, hardware or probe_hardware())
    return root / name


def has_engine(options: LoadOptions) -> bool:
    folder = engine_dir(options)
    return folder is not None and folder.is_dir() and any(p.suffix in ENGINE_SUFFIXES for p in folder.iterdir())


def prepare_engine_dir(options: LoadOptions, hardware: Hardware | None = None) -> Path | None:
    """Create the key folder (with key.json and the calibration table) and drop the oldest key folders."""
    hardware = hardware or probe_hardware()
    folder = engine_dir(options, hardware)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if options.model_sha256:
        _, parts = engine_key(options, hardware)
        (folder / "key.json").write_text(json.dumps(parts, indent=2, sort_keys=True))
        folder.touch()
        (folder.parent / "timing" / f"{hardware.gpu_arch}-trt{hardware.tensorrt}").mkdir(parents=True, exist_ok=True)
        _prune(folder.parent, keep=folder)
    table = _calibration(options)
    if table is not None and table.is_file() and not (folder / table.name).is_file():
        shutil.copyfile(table, folder / table.name)
    return folder


def _prune(root: Path, keep: Path) -> None:
    keyed = [p for p in root.iterdir() if p.is_dir() and (p / "key.json").is_file()]
    for old in sorted(keyed, key=lambda p: p.stat().st_mtime, reverse=True)[KEEP_ENGINE_DIRS:]:
        if old != keep:
            log.info("removing the TensorRT engines of an old key: %s", old.name)
            shutil.rmtree(old, ignore_errors=True)


def session_options(options: LoadOptions, hardware: Hardware | None = None) -> dict[str, str]:
    """The TensorRT EP options for this bundle (every value a string, as ORT's C API wants)."""
    trt = options.tensorrt
    fp16 = trt.fp16 if trt else options.precision == "fp16"
    int8 = trt.int8 if trt else options.precision.startswith("int8")
    result = {
        "device_id": "0",
        "trt_fp16_enable": str(fp16),
        "trt_int8_enable": str(int8),
        "trt_engine_cache_enable": str(options.cache_dir is not None),
        "trt_timing_cache_enable": str(options.cache_dir is not None),
    }
    if trt is not None:
        result["trt_builder_optimization_level"] = str(trt.builder_optimization_level)
    table = _calibration(options)
    if table is not None:
        result["trt_int8_calibration_table_name"] = table.name  # read from the engine cache folder
        result["trt_int8_use_native_calibration_table"] = "False"  # onnxruntime's flatbuffers table
    folder = engine_dir(options, hardware)
    if folder is not None:
        result["trt_engine_cache_path"] = str(folder)
        if options.model_sha256:
            hw = hardware or probe_hardware()
            timing = folder.parent / "timing" / f"{hw.gpu_arch}-trt{hw.tensorrt}"
            result["trt_timing_cache_path"] = str(timing)
        else:
            result["trt_timing_cache_path"] = str(folder)
    return result
