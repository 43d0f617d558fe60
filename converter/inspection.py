"""`edgefleet inspect`: what a model contains and what each profile's runtimes can and cannot run.

Operators by domain and opset (counting If/Loop/Scan bodies), the signature with symbolic dimensions, and per
profile and target: operators the runtime cannot run and why (OpenVINO: conversion and query_model; ONNX
Runtime: the session's graph-assignment info; CoreML EP: the supported-op lists shipped with onnxruntime;
TensorRT: its documented parser support; onnxruntime-web: the WASM EP's kernels), opset outside the profile's
range, dynamic shapes where a backend wants static ones, custom domains and whether a decomposition is known.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import onnxruntime as ort

from edgefleet.converter import large_model
from edgefleet.converter.model import SourceModel, load_model
from edgefleet.converter.onnx_graph import OpUse, dynamic_inputs, image_layout, op_inventory
from edgefleet.converter.passes import custom_ops
from edgefleet.converter.passes import tensorrt_support as support_tensorrt
from edgefleet.converter.passes.openvino import export_openvino
from edgefleet.converter.runners import openvino_devices
from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.custom_ops.packages import STANDARD_DOMAINS
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import Profile, Target

log = logging.getLogger(__name__)


@dataclass
class Unsupported:
    op: str  # "domain::Op" or "Op"
    reason: str


@dataclass
class TargetVerdict:
    runtime: str
    format: str
    providers: list[str]
    verdict: str  # "ok", "partial" (some ops fall back), "blocked", "unchecked"
    unsupported: list[Unsupported] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ProfileVerdict:
    profile: str
    opset_ok: bool
    targets: list[TargetVerdict]
    notes: list[str] = field(default_factory=list)


@dataclass
class InspectReport:
    model: str
    opsets: dict[str, int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    operators: list[OpUse]
    custom_domains: dict[str, int]
    dynamic_inputs: list[str]
    subgraph_ops: int
    profiles: list[ProfileVerdict]
    rewrites: list[str] = field(default_factory=list)  # recorded passes loading made (converter.normalize)
    class_labels: dict[str, list[str | int]] = field(default_factory=dict)
    quantization: dict[str, object] | None = None  # what it arrives quantized with (converter.quantized); None: float
    layouts: dict[str, str] = field(default_factory=dict)  # image inputs: NCHW or NHWC (channels last)


def _key(use: OpUse) -> str:
    return f"{use.domain}::{use.op_type}" if use.domain else use.op_type


def inspect_model(path: Path, profiles: list[Profile]) -> InspectReport:
    source = load_model(path)
    ops = op_inventory(source.proto)
    dynamic = dynamic_inputs(source.proto)
    return InspectReport(
        model=str(path),
        opsets=source.opset,
        inputs=source.inputs,
        outputs=source.outputs,
        operators=ops,
        custom_domains=source.custom_domains,
        dynamic_inputs=dynamic,
        subgraph_ops=sum(u.in_subgraphs for u in ops),
        profiles=[_profile(source, ops, dynamic, p) for p in profiles],
        rewrites=[f"{p.name} {p.params}" for p in source.passes],
        class_labels=source.class_labels,
        quantization=source.quantization.as_dict() | {"summary": source.quantization.describe()}
        if source.quantization
        else None,
        layouts={s.name: layout for s in source.inputs if (layout := image_layout(s.shape))},
    )


def _profile(source: SourceModel, ops: list[OpUse], dynamic: list[str], profile: Profile) -> ProfileVerdict:
    opset = source.opset.get("", 0)
    notes = []
    opset_ok = profile.opset.min <= opset <= profile.opset.max
    if not opset_ok:
        notes.append(
            f"opset {opset} outside the profile's range {profile.opset.min}-{profile.opset.max}: "
            "convert will try onnx's version converter"
        )
    if source.custom_domains:
        known = custom_ops.decompositions()
        custom = [op.key for op in custom_ops.custom_ops(source.proto)]
        listed = ", ".join(f"{op} ({'decomposition known' if op in known else 'no decomposition'})" for op in custom)
        notes.append(
            f"custom operators {listed or sorted(source.custom_domains)}: ONNX Runtime targets load implementations; "
            "elsewhere convert replaces known ones by standard ops"
        )
    return ProfileVerdict(profile.name, opset_ok, [_target(source, ops, dynamic, t) for t in profile.targets], notes)


def _target(source: SourceModel, ops: list[OpUse], dynamic: list[str], target: Target) -> TargetVerdict:
    """A checker that breaks on an exotic model gives an "unchecked" verdict naming the error, never a crash."""
    try:
        return _check_target(source, ops, dynamic, target)
    except Exception as err:  # runtimes' own front ends raise untyped errors on models they do not expect
        verdict = TargetVerdict(target.runtime, target.format, list(target.providers), "unchecked")
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        verdict.notes.append(f"the {target.runtime} check failed: {first}")
        return verdict


def _check_target(source: SourceModel, ops: list[OpUse], dynamic: list[str], target: Target) -> TargetVerdict:
    verdict = TargetVerdict(target.runtime, target.format, list(target.providers), "ok")
    if source.large:  # converter/large_model.py: ONNX Runtime and OpenVINO read it from its path
        kind = {"openvino": "ov", "coreml": "coreml"}.get(
            target.runtime, "trt" if target.format == "onnx-tensorrt" else "ort-fp32"
        )
        why = large_model.refusal(kind, target.runtime, target.format)
        if why:
            verdict.verdict = "blocked"
            verdict.notes.append(why)
            return verdict
        if target.runtime == "openvino":
            verdict.verdict = "unchecked"
            verdict.notes.append(
                "over protobuf's 2 GiB limit: convert reads it from its path into OpenVINO IR (FP32 with the "
                "profile's hints; NNCF INT8 not built); inspect does not load its weights to query the device"
            )
            return verdict
        verdict.notes.append(
            "over protobuf's 2 GiB limit: converted as exported (FP32), run from its path with its external data"
        )
    if target.static_shapes and dynamic:
        verdict.notes.append(
            f"{target.providers[0]} compiles static shapes only: inputs {dynamic} have dynamic dimensions "
            "(convert fixes them from the data, or pass --input-shape)"
        )
    if target.runtime == "openvino":
        _check_openvino(source, target, verdict)
    elif target.format == "onnx-tensorrt":
        _check_tensorrt(ops, dynamic, verdict)
    elif target.runtime == "coreml" or "CoreMLExecutionProvider" in target.providers:
        _check_coreml(ops, verdict, fallback_cpu="CPUExecutionProvider" in target.providers)
    elif target.runtime == "onnxruntime-web":
        _check_web(source, verdict)
    elif target.runtime == "onnxruntime":
        _check_onnxruntime(source, target, verdict)
    return verdict


def _check_openvino(source: SourceModel, target: Target, verdict: TargetVerdict) -> None:
    if not openvino_devices():
        verdict.verdict = "unchecked"
        verdict.notes.append("openvino is not installed here")
        return
    try:
        artifact = export_openvino(source.proto)
    except ConversionError as err:
        verdict.verdict = "blocked"
        failed = re.findall(r"(?:Conversion failed for |operations: )([\w.,\- ]+)", str(err))
        names = sorted({n.strip() for group in failed for n in group.split(",") if n.strip()})
        verdict.unsupported = [Unsupported(n, "OpenVINO's ONNX front end cannot convert it") for n in names]
        verdict.notes.append(str(err))
        scalars = [spec.name for spec in source.inputs if not spec.shape]
        if scalars:
            verdict.notes.append(
                f"scalar inputs {scalars}: if they are constant in use, `convert --pin NAME=VALUE` lets folding "
                "specialise the graph (silero-vad converts once sr is pinned)"
            )
        return
    devices = [p.split(":", 1)[1] for p in target.providers]
    here = [d for d in devices if d in openvino_devices()]
    if not here:
        verdict.notes.append(f"converted; device {'/'.join(devices)} absent here, query_model not run")
        return
    import openvino as ov

    try:
        supported = ov.Core().query_model(artifact.model, here[0])
    except Exception as err:  # the plugin refuses the model outright (e.g. dynamic-rank If on CPU)
        verdict.verdict = "blocked"
        verdict.notes.append(f"openvino:{here[0]} refuses the model: {str(err).strip().splitlines()[-1][:300]}")
        return
    missing = sorted({op.get_type_name() for op in artifact.model.get_ops() if op.get_friendly_name() not in supported})
    missing = [m for m in missing if m not in ("Parameter", "Result", "Constant")]
    if missing:
        verdict.verdict = "partial"
        verdict.unsupported = [Unsupported(m, f"query_model: not supported on {here[0]}") for m in missing]


def _check_onnxruntime(source: SourceModel, target: Target, verdict: TargetVerdict) -> None:
    available = set(ort.get_available_providers())
    providers = [p for p in target.providers if p in available] or ["CPUExecutionProvider"]
    if providers != [p for p in target.providers if p in available]:
        verdict.notes.append(f"{target.providers} not available here: checked against the CPU EP's kernels")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    try:
        model = source.proto.SerializeToString() if source.passes else str(source.path)
        session = ort.InferenceSession(model, options, providers=providers)
    except Exception as err:  # ORT raises untyped errors naming the op it lacks
        verdict.verdict = "blocked"
        text = str(err).strip().splitlines()[0][:300]
        op = re.search(r"Op type not registered '(\w+)'|Could not find an implementation for (\w+)", text)
        if op:
            verdict.unsupported.append(Unsupported(op.group(1) or op.group(2), text))
        verdict.notes.append(f"onnxruntime cannot load the model: {text}")
        return
    try:
        assigned = session.get_provider_graph_assignment_info()
    except Exception:  # older builds have no assignment info
        return
    by_ep: dict[str, int] = {}
    for sub in assigned:
        ep = getattr(sub, "ep_name", "?")
        nodes = sub.get_nodes() if hasattr(sub, "get_nodes") else []
        by_ep[ep] = by_ep.get(ep, 0) + len(nodes)
    if by_ep:
        verdict.notes.append("nodes per execution provider: " + ", ".join(f"{k} {v}" for k, v in by_ep.items()))
    if len(by_ep) > 1:
        verdict.verdict = "partial"


def _check_web(source: SourceModel, verdict: TargetVerdict) -> None:
    from edgefleet.converter.passes import web

    verdict.notes.append(f"checked against the WASM EP's kernels (onnxruntime-web {web.ORT_WEB_VERSION})")
    missing = web.wasm_unsupported(source.proto)
    if missing:
        verdict.verdict = "blocked"
        verdict.unsupported = [Unsupported(op, why) for op, why in sorted(missing.items())]
    if source.proto.ir_version > web.MAX_IR_VERSION:
        verdict.notes.append(f"IR version {source.proto.ir_version}: convert caps it at {web.MAX_IR_VERSION}")


@cache
def _coreml_ops() -> dict[str, str]:
    base = Path(ort.__file__).parent / "tools" / "mobile_helpers" / "coreml_supported_mlprogram_ops.md"
    ops: dict[str, str] = {}
    try:
        for line in base.read_text("utf-8").splitlines():
            found = re.match(r"\|ai\.onnx:(\w+)\|(.*)\|", line)
            if found:
                ops[found.group(1)] = found.group(2).replace("<br/>", " ")
    except OSError:
        pass
    return ops


def _check_coreml(ops: list[OpUse], verdict: TargetVerdict, fallback_cpu: bool) -> None:
    known = _coreml_ops()
    if not known:
        verdict.verdict = "unchecked"
        verdict.notes.append("onnxruntime ships no CoreML supported-op list here")
        return
    verdict.notes.append("checked against onnxruntime's coreml_supported_mlprogram_ops.md")
    for use in ops:
        if use.op_type in ("Constant",):
            continue
        if use.domain not in ("",) or use.op_type not in known:
            verdict.unsupported.append(Unsupported(_key(use), "not in the CoreML EP's ML Program op list"))
        elif known[use.op_type].strip():
            verdict.notes.append(f"{use.op_type}: {known[use.op_type].strip()}")
    if verdict.unsupported:
        verdict.verdict = "partial" if fallback_cpu else "blocked"
        if fallback_cpu:
            verdict.notes.append("unsupported nodes fall back to the CPU EP (partitions cost copies)")


def _check_tensorrt(ops: list[OpUse], dynamic: list[str], verdict: TargetVerdict) -> None:
    verdict.notes.append(f"checked against {support_tensorrt.SOURCE}")
    for use in ops:
        if use.domain in STANDARD_DOMAINS - {""} or use.domain or use.op_type not in support_tensorrt.SUPPORTED:
            verdict.unsupported.append(Unsupported(_key(use), support_tensorrt.UNSUPPORTED_REASON))
        elif use.op_type in support_tensorrt.NOTES:
            verdict.notes.append(f"{use.op_type}: {support_tensorrt.NOTES[use.op_type]}")
    if dynamic:
        verdict.notes.append(f"dynamic inputs {dynamic}: TensorRT needs optimization profiles (min/opt/max shapes)")
    if verdict.unsupported:
        verdict.verdict = "partial"
        verdict.notes.append("unsupported nodes fall back to the CUDA/CPU EPs inside ONNX Runtime")
