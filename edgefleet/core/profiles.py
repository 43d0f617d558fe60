"""Hardware profiles: one YAML file per profile in device_profiles/, validated by the models below."""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from edgefleet.core import arm_hwcaps
from edgefleet.core.errors import UnknownNameError, UserInputError

PROFILES_DIR = Path(str(resources.files("edgefleet.device_profiles")))  # device_profiles/, mapped by setup.py
ARM64_ARCHS = frozenset({"aarch64", "arm64"})  # platform.machine() on Linux, on macOS

Precision = Literal["fp32", "fp16", "bf16", "int8-dynamic", "int8-static", "int8-weights"]
Runtime = Literal["onnxruntime", "openvino", "coreml", "tensorrt", "onnxruntime-web"]
BundleFormat = Literal["onnx", "openvino-ir", "coreml", "onnx-tensorrt"]

# Provider names, by runtime: bare ONNX Runtime execution-provider names; `openvino:DEVICE` for the OpenVINO
# runtime; `coreml:COMPUTE_UNITS` for the CoreML runtime; `web:BACKEND` for onnxruntime-web in a browser.
ORT_PROVIDERS = frozenset(
    {
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "OpenVINOExecutionProvider",
        "CoreMLExecutionProvider",
        "DmlExecutionProvider",
        "QNNExecutionProvider",
        "XnnpackExecutionProvider",
    }
)
_PREFIXED_PROVIDERS = {
    "openvino": ("openvino:", frozenset({"CPU", "GPU", "NPU", "AUTO"})),
    "coreml": ("coreml:", frozenset({"ALL", "CPU_AND_GPU", "CPU_AND_NE", "CPU_ONLY"})),
    "onnxruntime-web": ("web:", frozenset({"wasm", "webgpu", "webnn"})),
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MatchRules(_Frozen):
    """How `profiles detect` and `agent --profile auto` recognise the hardware. All given rules must hold."""

    arch: list[str] = Field(description="platform.machine() values, e.g. x86_64, aarch64, arm64")
    os: list[str] = Field(default_factory=list, description="platform.system() lowercased; empty = any")
    cpu_flags_all: list[str] = Field(default_factory=list, description="/proc/cpuinfo flags that must all be set")
    cpu_flags_any: list[str] = Field(default_factory=list, description="at least one of these flags")
    files: list[str] = Field(default_factory=list, description="files that must exist, e.g. /etc/nv_tegra_release")
    providers_any: list[str] = Field(default_factory=list, description="an available ORT execution provider")
    cpu_vendor: list[str] = Field(
        default_factory=list, description="/proc/cpuinfo vendor_id values, e.g. GenuineIntel; empty = any"
    )
    board_any: list[str] = Field(
        default_factory=list,
        description="substrings of the device-tree model (/proc/device-tree/model), e.g. 'Raspberry Pi 5'",
    )


class Target(_Frozen):
    """One way to run a model on this hardware; a profile lists them in preference order."""

    runtime: Runtime
    format: BundleFormat
    providers: list[str] = Field(
        min_length=1,
        description="execution providers / devices, in preference order: ONNX Runtime EP names "
        "(CPUExecutionProvider, ...), openvino:CPU|GPU|NPU|AUTO, coreml:ALL|..., web:wasm|webgpu|webnn",
    )
    precisions: list[Precision] = Field(min_length=1, description="precision recipes worth trying, best first")
    int8_reduce_range: bool = Field(
        default=False, description="7-bit weights for int8: avoids saturation on CPUs without VNNI"
    )
    int8_activations: Literal["uint8", "int8"] = Field(
        default="uint8",
        description="INT8 static QDQ activation type: uint8 (U8S8, what x86 VNNI kernels fuse) or int8 (S8S8, ARM)",
    )
    int8_fast_with: list[str] = Field(
        default_factory=list,
        description="CPU flags (/proc/cpuinfo) of which one makes this target's INT8 kernels fast: ARMv8.2's dot "
        "product (asimddp) or x86 VNNI (avx512_vnni, avx_vnni); a device with none runs INT8 without them, often "
        "no faster than FP32 (empty: INT8 speed depends on no such instruction)",
    )
    inference_precision_hint: Literal["f32", "f16", "bf16"] | None = Field(
        default=None,
        description="OpenVINO INFERENCE_PRECISION_HINT the bundle pins (f32 stops CPUs with AVX-512 BF16 or AMX "
        "from silently running FP32 models in bf16)",
    )
    static_shapes: bool = Field(
        default=False, description="the runtime compiles for fixed input shapes (e.g. the Intel NPU)"
    )
    ort_format: bool = Field(
        default=False,
        description="onnxruntime-web: ship the model in ONNX Runtime's ORT format (smaller, loads faster; only "
        "basic graph optimizations are baked in, so it stays portable)",
    )

    @model_validator(mode="after")
    def _options_fit_runtime(self) -> Target:
        if "bf16" in self.precisions and self.runtime != "openvino":
            raise ValueError("bf16 is an OpenVINO inference precision (AVX512_BF16 / AMX CPUs); use fp16 elsewhere")
        if "int8-weights" in self.precisions and self.runtime != "coreml":
            raise ValueError("int8-weights (weight-only quantization) is a CoreML recipe; use int8-static elsewhere")
        if self.ort_format and self.runtime != "onnxruntime-web":
            raise ValueError("ort_format applies to onnxruntime-web targets only")
        if self.format == "onnx-tensorrt" and "TensorrtExecutionProvider" not in self.providers:
            raise ValueError("onnx-tensorrt targets must list TensorrtExecutionProvider")
        return self

    @model_validator(mode="after")
    def _providers_fit_runtime(self) -> Target:
        if self.runtime in ("onnxruntime", "tensorrt"):
            # An ONNX file also runs on the OpenVINO runtime (it reads ONNX directly): the device may measure it.
            also = _openvino_names() if self.format == "onnx" else set()
            wrong = [p for p in self.providers if p not in ORT_PROVIDERS and p not in also]
            if wrong:
                raise ValueError(f"unknown ONNX Runtime providers {wrong}; known: {sorted(ORT_PROVIDERS)}")
            return self
        prefix, devices = _PREFIXED_PROVIDERS[self.runtime]
        wrong = [p for p in self.providers if not p.startswith(prefix) or p[len(prefix) :] not in devices]
        if wrong:
            raise ValueError(f"{self.runtime} providers must be {prefix}{{{','.join(sorted(devices))}}}, not {wrong}")
        return self


def _openvino_names() -> set[str]:
    prefix, devices = _PREFIXED_PROVIDERS["openvino"]
    return {prefix + device for device in devices}


GenerativeRuntime = Literal["onnxruntime-genai", "openvino-genai"]
GenerativePrecision = Literal["fp32", "fp16", "bf16", "int8-weights", "int4-weights"]
# Generative providers: `onnxruntime-genai:cpu|cuda` (ONNX Runtime GenAI's execution provider) and
# `openvino-genai:CPU|GPU|NPU` (an OpenVINO GenAI device).
GENERATIVE_PROVIDERS = {
    "onnxruntime-genai": ("onnxruntime-genai:", frozenset({"cpu", "cuda"})),
    "openvino-genai": ("openvino-genai:", frozenset({"CPU", "GPU", "NPU"})),
}
GENERATIVE_FORMAT = {"onnxruntime-genai": "onnx-genai", "openvino-genai": "openvino-genai"}


class GenerativeTarget(_Frozen):
    """One way to run a language model on this hardware: a generation runtime, its devices, and the weight
    precisions worth trying, best first (converter/generative/)."""

    runtime: GenerativeRuntime
    providers: list[str] = Field(
        min_length=1, description="onnxruntime-genai:cpu|cuda or openvino-genai:CPU|GPU|NPU, in preference order"
    )
    precisions: list[GenerativePrecision] = Field(min_length=1, description="weight precisions, best first")

    @property
    def format(self) -> str:
        return GENERATIVE_FORMAT[self.runtime]

    @model_validator(mode="after")
    def _fits_runtime(self) -> GenerativeTarget:
        prefix, devices = GENERATIVE_PROVIDERS[self.runtime]
        wrong = [p for p in self.providers if not p.startswith(prefix) or p[len(prefix) :] not in devices]
        if wrong:
            raise ValueError(f"{self.runtime} providers must be {prefix}{{{','.join(sorted(devices))}}}, not {wrong}")
        if "bf16" in self.precisions and self.runtime != "openvino-genai":
            raise ValueError("bf16 generation is an OpenVINO precision hint (AVX512_BF16 / AMX CPUs)")
        return self


class OpsetRange(_Frozen):
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> OpsetRange:
        if self.min > self.max:
            raise ValueError(f"opset min {self.min} is above max {self.max}")
        return self


class AccuracyBudget(_Frozen):
    max_drop: float = Field(ge=0, le=1, description="largest allowed drop of top-1 / agreement vs FP32")
    min_sqnr_db: float = Field(
        default=30.0,
        ge=0,
        description="for outputs that are not class scores: lowest allowed signal-to-quantization-noise ratio "
        "(dB) of every float output against the FP32 reference",
    )


class Profile(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    match: MatchRules
    accelerators: list[str]
    memory_budget_mb: int = Field(gt=0)
    targets: list[Target] = Field(min_length=1)
    opset: OpsetRange
    accuracy_budget: AccuracyBudget
    size_limit_mb: float = Field(gt=0)
    intra_op_threads: int = Field(default=0, ge=0, description="threads the device gives inference; 0 = all")
    threads: list[PositiveInt] = Field(
        default_factory=list,
        description="thread counts its devices run inference with: the converter times candidates at each (the "
        "first decides) and records them; empty = the converter's --threads",
    )
    refines: list[str] = Field(
        default_factory=list,
        description="profiles this one narrows down (intel-x86-vnni refines generic-x86-64): every device of this "
        "profile also runs their bundles, and the control plane falls back to them when no bundle is built for "
        "this one",
    )
    sources: list[str] = Field(default_factory=list, description="vendor documentation the values come from")
    generation: list[GenerativeTarget] = Field(
        default_factory=list,
        description="language models: generation runtimes in preference order (empty: no generative bundles)",
    )

    @field_validator("targets")
    @classmethod
    def _distinct_targets(cls, targets: list[Target]) -> list[Target]:
        seen = [(t.runtime, t.format, tuple(t.providers)) for t in targets]
        if len(set(seen)) != len(seen):
            raise ValueError("two targets with the same runtime, format and providers")
        return targets

    @property
    def specificity(self) -> int:
        """More rules = more specific; detection prefers the most specific profile that matches."""
        rules = self.match
        return (
            len(rules.cpu_flags_all)
            + min(1, len(rules.cpu_flags_any))
            + 2 * len(rules.files)
            + min(1, len(rules.providers_any))
            + min(1, len(rules.os))
            + min(1, len(rules.cpu_vendor))
            + 2 * min(1, len(rules.board_any))
        )


def _load_file(path: Path) -> Profile:
    try:
        data = yaml.safe_load(path.read_text())
        profile = Profile.model_validate(data)
    except (OSError, yaml.YAMLError) as err:
        raise UserInputError(f"cannot read profile {path}: {err}") from err
    except ValidationError as err:
        first = err.errors()[0]
        raise UserInputError(f"profile {path.name}: {first['msg']} at {'.'.join(map(str, first['loc']))}") from err
    if profile.name != path.stem:
        raise UserInputError(f"profile {path.name} declares name {profile.name!r}; they must match")
    return profile


@cache
def load_profiles(directory: Path = PROFILES_DIR) -> dict[str, Profile]:
    profiles = {p.stem: _load_file(p) for p in sorted(directory.glob("*.yaml"))}
    if not profiles:
        raise UserInputError(f"no profiles found in {directory}")
    for profile in profiles.values():
        unknown = [name for name in profile.refines if name not in profiles]
        if unknown:
            raise UserInputError(f"profile {profile.name} refines unknown profile(s) {unknown}")
        if profile.name in profile.refines or any(profile.name in lineage(p, profiles) for p in profile.refines):
            raise UserInputError(f"profile {profile.name} refines itself through {profile.refines}")
        for parent in profile.refines:
            wider = set(profile.match.arch) - set(profiles[parent].match.arch)
            if wider:
                raise UserInputError(
                    f"profile {profile.name} refines {parent} but matches arch {sorted(wider)} it does not"
                )
    return profiles


def lineage(name: str, profiles: Mapping[str, Profile]) -> list[str]:
    """`name`, then every profile it refines, nearest first (breadth first, each once). A name the mapping does not
    know stands alone."""
    order, queue = [name], [name]
    while queue:
        current = profiles.get(queue.pop(0))
        for parent in current.refines if current else ():
            if parent not in order:
                order.append(parent)
                queue.append(parent)
    return order


def profile_lineage(name: str, directory: Path = PROFILES_DIR) -> list[str]:
    """`lineage` over the installed profiles: the profiles whose bundles a device of profile `name` runs, nearest
    first."""
    return lineage(name, load_profiles(directory))


def get_profile(name: str, directory: Path = PROFILES_DIR) -> Profile:
    profiles = load_profiles(directory)
    if name not in profiles:
        raise UnknownNameError("profile", name, profiles)
    return profiles[name]


@dataclass(frozen=True)
class HostFacts:
    arch: str
    os: str
    cpu_flags: frozenset[str]
    existing_files: frozenset[str] = frozenset()
    providers: frozenset[str] = frozenset()
    notes: tuple[str, ...] = field(default=())
    cpu_vendor: str = ""
    board: str = ""

    @classmethod
    def probe(cls, watched_files: Iterable[str] = ()) -> HostFacts:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
        board = ""
        for model_file in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
            try:
                board = Path(model_file).read_bytes().rstrip(b"\x00").decode("utf-8", "replace").strip()
                break
            except OSError:
                continue
        try:
            import onnxruntime

            providers = frozenset(onnxruntime.get_available_providers())
        except ImportError:
            providers = frozenset()
        arch = platform.machine()
        return cls.parse(
            cpuinfo,
            arch=arch,
            os=platform.system(),
            existing_files=frozenset(f for f in watched_files if Path(f).exists()),
            providers=providers,
            board=board,
            hwcaps=arm_hwcaps.read() if arch.lower() in ARM64_ARCHS else (),
        )

    @classmethod
    def parse(
        cls, cpuinfo: str, *, arch: str, os: str, existing_files: Iterable[str] = (),
        providers: Iterable[str] = (), board: str = "", hwcaps: Iterable[str] = (),
    ) -> HostFacts:  # fmt: skip
        """The facts from /proc/cpuinfo's text (x86 `flags` and `vendor_id`, ARM `Features`; the first
        processor's), the machine and system names, the watched files that exist, the providers and the board.

        On ARM64, `hwcaps` (the kernel's auxiliary vector, core/arm_hwcaps.py) add to `Features`, and x86 lines
        are ignored: QEMU's user mode before 8.1 shows an emulated aarch64 program the host's x86 /proc/cpuinfo."""
        arm = arch.lower() in ARM64_ARCHS
        flags: set[str] = set(hwcaps)
        vendor = ""
        for line in cpuinfo.splitlines():
            if line.startswith("vendor_id") and not vendor and not arm:
                vendor = line.split(":", 1)[1].strip()
            if line.startswith("Features" if arm else ("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
                break
        return cls(
            arch=arch.lower(),
            os=os.lower(),
            cpu_flags=frozenset(flags),
            existing_files=frozenset(existing_files),
            providers=frozenset(providers),
            cpu_vendor=vendor,
            board=board,
        )


def match_reasons(profile: Profile, facts: HostFacts) -> list[str]:
    """Why `profile` does not fit `facts`; empty when it matches."""
    rules, misses = profile.match, []
    if facts.arch not in rules.arch:
        misses.append(f"arch {facts.arch} not in {rules.arch}")
    if rules.os and facts.os not in rules.os:
        misses.append(f"os {facts.os} not in {rules.os}")
    lacking = [flag for flag in rules.cpu_flags_all if flag not in facts.cpu_flags]
    if lacking:
        misses.append(f"CPU lacks {', '.join(lacking)}")
    if rules.cpu_flags_any and not facts.cpu_flags.intersection(rules.cpu_flags_any):
        misses.append(f"CPU has none of {', '.join(rules.cpu_flags_any)}")
    absent = [f for f in rules.files if f not in facts.existing_files]
    if absent:
        misses.append(f"missing {', '.join(absent)}")
    if rules.providers_any and not facts.providers.intersection(rules.providers_any):
        misses.append(f"no provider among {', '.join(rules.providers_any)}")
    if rules.cpu_vendor and facts.cpu_vendor not in rules.cpu_vendor:
        misses.append(f"CPU vendor {facts.cpu_vendor or 'unknown'} not in {rules.cpu_vendor}")
    if rules.board_any and not any(b in facts.board for b in rules.board_any):
        misses.append(f"board {facts.board or 'unknown'!r} is none of {rules.board_any}")
    return misses


def int8_notes(profile: Profile, facts: HostFacts) -> list[str]:
    """What the CPU lacks for `profile`'s INT8 targets to be fast (Target.int8_fast_with), one line a target."""
    notes = []
    for target in profile.targets:
        wanted = target.int8_fast_with
        if wanted and any(p.startswith("int8") for p in target.precisions) and not facts.cpu_flags & set(wanted):
            notes.append(
                f"{target.runtime} INT8: the CPU has none of {', '.join(wanted)}; its INT8 kernels run without a "
                "dot-product instruction, often no faster than FP32"
            )
    return notes


def detect(profiles: Iterable[Profile], facts: HostFacts) -> list[Profile]:
    """Matching profiles, most specific first: deepest in the refinement tree, then by the number of match rules."""
    known = {p.name: p for p in profiles}
    matching = [p for p in known.values() if not match_reasons(p, facts)]
    return sorted(matching, key=lambda p: (-len(lineage(p.name, known)), -p.specificity, p.name))


def match_summary(profile: Profile) -> str:
    """The rules `profile` matches by, in words (what a machine it matches holds)."""
    rules = profile.match
    held = [f"arch {'|'.join(rules.arch)}"]
    held += [f"os {'|'.join(rules.os)}"] if rules.os else []
    held += [f"CPU flags {'+'.join(rules.cpu_flags_all)}"] if rules.cpu_flags_all else []
    held += [f"a CPU flag of {'|'.join(rules.cpu_flags_any)}"] if rules.cpu_flags_any else []
    held += [f"vendor {'|'.join(rules.cpu_vendor)}"] if rules.cpu_vendor else []
    held += [f"files {', '.join(rules.files)}"] if rules.files else []
    held += [f"board {'|'.join(rules.board_any)}"] if rules.board_any else []
    held += [f"provider {'|'.join(rules.providers_any)}"] if rules.providers_any else []
    refines = f"; refines {', '.join(profile.refines)}" if profile.refines else ""
    return f"{', '.join(held)}{refines}"


def detection_reasons(profiles: Iterable[Profile], facts: HostFacts) -> list[str]:
    """Why detection chose what it chose, one line each: every profile that matches (most specific first) and the
    rules it holds; every profile refining one of them that does not match, and why not; what the chosen profile's
    INT8 targets lack on this CPU (int8_notes)."""
    known = {p.name: p for p in profiles}
    matching = detect(known.values(), facts)
    names = {p.name for p in matching}
    lines = [f"{p.name} matches: {match_summary(p)}" for p in matching]
    lines += [
        f"{p.name} does not: {'; '.join(match_reasons(p, facts))}"
        for p in sorted(known.values(), key=lambda p: p.name)
        if p.name not in names and names.intersection(p.refines)
    ]
    if matching:
        lines += [f"{matching[0].name}: {note}" for note in int8_notes(matching[0], facts)]
    return lines


def detect_profile(directory: Path = PROFILES_DIR) -> Profile:
    """The most specific profile this machine satisfies."""
    return detect_profiles(directory)[0]


def detect_profiles(directory: Path = PROFILES_DIR) -> list[Profile]:
    """Every profile this machine satisfies, most specific first (UserInputError when none does)."""
    return detect_explained(directory)[0]


def detect_explained(directory: Path = PROFILES_DIR) -> tuple[list[Profile], list[str]]:
    """`detect_profiles`, with `detection_reasons` for what it found."""
    profiles = load_profiles(directory).values()
    facts = HostFacts.probe(f for p in profiles for f in p.match.files)
    found = detect(profiles, facts)
    if not found:
        raise UserInputError(f"no profile matches this machine ({facts.arch}, {facts.os}); pass --profile NAME")
    return found, detection_reasons(profiles, facts)


def device_profiles(choice: str, directory: Path = PROFILES_DIR) -> list[Profile]:
    """The profiles whose bundles a device runs, most specific first: with "auto", every profile the machine
    satisfies; with a name, that profile and the profiles it refines (the operator vouches for the hardware)."""
    if choice == "auto":
        return detect_profiles(directory)
    profiles = load_profiles(directory)
    get_profile(choice, directory)
    return [profiles[name] for name in lineage(choice, profiles)]
