"""What this converter can do for each runtime target of a profile, on this machine.

A target is *buildable* when the converter knows how to produce its format, and *measurable* when this host
is the profile's hardware and has the target's runtime and device; a buildable target that is not measurable
is built and its accuracy checked on this host's CPU (a proxy), but its latency is not measured.

Proxies: TensorRT bundles run here as the same recipe on the CPU EP (the engine is built on the device);
onnxruntime-web bundles on the CPU EP (the WASM EP's kernels are the CPU kernels compiled to WebAssembly);
CoreML packages off macOS as the onnx2torch module in torch with the recipe emulated.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from edgefleet.converter.measure import openvino_devices
from edgefleet.converter.passes import coreml as cml
from edgefleet.core.profiles import HostFacts, Profile, Target, match_reasons


@dataclass(frozen=True)
class TargetStatus:
    buildable: bool
    measurable: bool
    run_on: str  # the provider / OpenVINO device used on this host (for accuracy, and latency when measurable)
    reason: str  # why not buildable, or why latency is not measured


def target_label(target: Target) -> str:
    return f"{target.runtime}/{target.format} [{', '.join(target.providers)}]"


def target_status(profile: Profile, target: Target, facts: HostFacts, ort_providers: frozenset[str]) -> TargetStatus:
    misses = match_reasons(profile, facts)
    if target.runtime == "coreml":
        missing = cml.missing_packages()
        if missing:
            return TargetStatus(False, False, "", missing)
        if platform.system() != "Darwin":
            return TargetStatus(
                True, False, "torch", "CoreML predicts only on macOS: accuracy from the onnx2torch module in torch"
            )
        if misses:
            return TargetStatus(True, False, "torch", f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, target.providers[0], "")
    if target.runtime == "onnxruntime-web":
        return TargetStatus(
            True, False, "CPUExecutionProvider", "runs in a web browser: accuracy on the CPU EP, whose kernels the "
            "WASM EP compiles to WebAssembly; latency is measured in the browser, not here"
        )  # fmt: skip
    if target.runtime == "onnxruntime":
        here = [p for p in target.providers if p in ort_providers]
        if not here:
            return TargetStatus(
                True, False, "CPUExecutionProvider", f"none of {target.providers} is available here (accuracy on the "
                "CPU EP as a proxy)"
            )  # fmt: skip
        if misses:
            return TargetStatus(True, False, here[0], f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, here[0], "")
    if target.runtime == "openvino":
        devices = openvino_devices()
        if not devices:
            return TargetStatus(False, False, "", "the openvino package is not installed (pip install openvino)")
        wanted = [p.split(":", 1)[1] for p in target.providers]
        here = [d for d in wanted if d in devices or (d == "AUTO" and devices)]
        if not here:
            return TargetStatus(
                True, False, "CPU", f"OpenVINO device {'/'.join(wanted)} is not present here (have {list(devices)}); "
                "accuracy on openvino:CPU as a proxy"
            )  # fmt: skip
        if misses:
            return TargetStatus(True, False, "CPU", f"this host is not {profile.name} ({'; '.join(misses)})")
        return TargetStatus(True, True, "CPU" if here[0] == "AUTO" else here[0], "")
    return TargetStatus(False, False, "", f"runtime {target.runtime} is not supported by this converter")
