"""Custom operators: find them, decide per target whether to keep or decompose them, inline standard-op
decompositions, and run models that still hold them on this host (the FP32 reference needs the real op).

A custom op ties a model to the runtimes that implement it, so standard ops are preferred: where a known
decomposition exists the converter inlines it (an ONNX function in standard ops, gated against the FP32
reference like every graph pass), unless the policy says to keep custom ops on targets that can load them.

Implementations and decompositions come from *custom-op packages* (edgefleet/core/custom_ops/packages.py documents
the format; models/custom_op/swish_op.py is the worked example).

A few ONNX Runtime contrib ops (com.microsoft Gelu, BiasGelu, QuickGelu) have built-in decompositions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
import onnx.inliner
from onnx import helper

from edgefleet.converter.onnx_graph import walk_nodes
from edgefleet.core.bundle.manifest import CustomOp
from edgefleet.core.custom_ops import packages as op_packages
from edgefleet.core.custom_ops.packages import ENV_VAR, LIBRARY_ENV_VAR, STANDARD_DOMAINS, OpDefinition, ort_native_ops
from edgefleet.core.errors import ConversionError

log = logging.getLogger(__name__)

Policy = Literal["decompose", "host", "keep"]
POLICIES: tuple[Policy, ...] = ("decompose", "host", "keep")
MIN_FUNCTION_OPSET = 12  # Constant(value_float) with an attribute reference
OpPackageEntry = OpDefinition


def packages() -> dict[str, OpPackageEntry]:
    """Every operator the configured custom-op packages define, by `domain::op_type` (imported once); a package
    that cannot be imported is a user error."""
    return op_packages.load_definitions(strict=True)


# --- what the model holds -----------------------------------------------------------------------------------


def custom_ops(model: onnx.ModelProto) -> list[CustomOp]:
    """Operators outside the standard domains (counting If/Loop/Scan bodies), except the model's own functions."""
    opsets = {(imp.domain or ""): int(imp.version) for imp in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    known = packages()
    found: dict[tuple[str, str], CustomOp] = {}
    for node, _where in walk_nodes(model.graph):
        domain = node.domain or ""
        if domain in STANDARD_DOMAINS or (domain, node.op_type) in local or (domain, node.op_type) in found:
            continue
        entry = known.get(f"{domain}::{node.op_type}")
        found[(domain, node.op_type)] = CustomOp(
            domain=domain, op_type=node.op_type, version=opsets.get(domain, 0), library=entry.library if entry else None
        )
    return sorted(found.values(), key=lambda op: op.key)


def hosts_custom_ops(runtime: str, bundle_format: str) -> bool:
    """Whether a target can load custom-op implementations: ONNX Runtime can (registered libraries, Python ops
    through onnxruntime-extensions; under the TensorRT EP those nodes run on the CPU between engine partitions).
    OpenVINO, CoreML (through onnx2torch) and onnxruntime-web cannot."""
    return runtime == "onnxruntime" and bundle_format in ("onnx", "onnx-tensorrt")


# --- decompositions -------------------------------------------------------------------------------------------


def _gelu(opset: int) -> onnx.FunctionProto:
    nodes = [
        helper.make_node("Constant", [], ["sqrt2"], value_float=2.0**0.5),
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Div", ["X", "sqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["plus"]),
        helper.make_node("Mul", ["X", "plus"], ["prod"]),
        helper.make_node("Mul", ["prod", "half"], ["Y"]),
    ]
    return helper.make_function("com.microsoft", "Gelu", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)])


def _bias_gelu(opset: int) -> onnx.FunctionProto:
    inner = _gelu(opset)
    nodes = [helper.make_node("Add", ["A", "B"], ["X"]), *inner.node]
    return helper.make_function("com.microsoft", "BiasGelu", ["A", "B"], ["Y"], nodes, [helper.make_opsetid("", opset)])


def _quick_gelu(opset: int) -> onnx.FunctionProto:
    alpha = helper.make_node("Constant", [], ["alpha"], value_float=1.702)
    alpha.attribute[0].ref_attr_name = "alpha"
    nodes = [
        alpha,
        helper.make_node("Mul", ["X", "alpha"], ["scaled"]),
        helper.make_node("Sigmoid", ["scaled"], ["gate"]),
        helper.make_node("Mul", ["X", "gate"], ["Y"]),
    ]
    return helper.make_function(
        "com.microsoft", "QuickGelu", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)],
        attributes=[], attribute_protos=[helper.make_attribute("alpha", 1.702)],
    )  # fmt: skip


BUILT_IN: dict[str, Callable[[int], onnx.FunctionProto]] = {
    "com.microsoft::Gelu": _gelu,
    "com.microsoft::BiasGelu": _bias_gelu,
    "com.microsoft::QuickGelu": _quick_gelu,
}


def decompositions() -> dict[str, tuple[Callable[[int], onnx.FunctionProto], str]]:
    """op key → (function factory taking the model's default opset, where it comes from)."""
    found = {key: (factory, "built in") for key, factory in BUILT_IN.items()}
    for key, entry in packages().items():
        if entry.decomposition is not None:
            found[key] = (entry.decomposition, entry.origin)
    return found


@dataclass(frozen=True)
class DecomposeConfig:
    ops: tuple[str, ...]  # `domain::op_type` keys to replace


def decompose(model: onnx.ModelProto, config: DecomposeConfig) -> onnx.ModelProto:
    """Inline the standard-op decomposition of each listed custom op; drop domains no node uses any more."""
    from edgefleet.converter.passes.graph import copy_model, default_opset

    known = decompositions()
    unknown = [key for key in config.ops if key not in known]
    if unknown:
        raise ConversionError(f"no standard-op decomposition is known for {', '.join(unknown)}")
    opset = default_opset(model)
    if opset < MIN_FUNCTION_OPSET:
        raise ConversionError(f"decompositions need default-domain opset {MIN_FUNCTION_OPSET}+, the model has {opset}")
    out = copy_model(model)
    ids = []
    for key in config.ops:
        try:
            function = known[key][0](opset)
        except Exception as err:  # a package's factory is user code
            raise ConversionError(f"the decomposition of {key} ({known[key][1]}) failed: {err}") from err
        if f"{function.domain}::{function.name}" != key:
            raise ConversionError(f"the decomposition of {key} defines {function.domain}::{function.name}")
        out.functions.append(function)
        ids.append((function.domain, function.name))
    try:
        out = onnx.inliner.inline_selected_functions(out, ids)
    except Exception as err:  # the inliner raises its own C++ errors
        raise ConversionError(f"inlining decompositions failed: {err}") from err
    _drop_unused_domains(out)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as err:
        raise ConversionError(f"the decomposed model does not check: {str(err).splitlines()[0]}") from err
    return out


def _drop_unused_domains(model: onnx.ModelProto) -> None:
    used = {node.domain or "" for node, _ in walk_nodes(model.graph)}
    used |= {f.domain for f in model.functions} | {"", "ai.onnx"}
    keep = [imp for imp in model.opset_import if (imp.domain or "") in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


@dataclass(frozen=True)
class Plan:
    decompose: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    blocked: dict[str, str] = field(default_factory=dict)  # op key → why the target cannot have it


def plan(ops: Iterable[CustomOp], policy: Policy, runtime: str, bundle_format: str) -> Plan:
    """Which custom ops to decompose, which to keep, and which block the target. Pure."""
    hosts = hosts_custom_ops(runtime, bundle_format)
    known = decompositions()
    decompose_, keep, blocked = [], [], {}
    cannot = f"{runtime} ({bundle_format}) cannot load custom operators"
    for op in ops:
        has = op.key in known
        if policy == "decompose" and has:
            decompose_.append(op.key)
        elif hosts:
            keep.append(op.key)
        elif policy != "keep" and has:
            decompose_.append(op.key)
        elif policy == "keep":
            blocked[op.key] = f"{cannot}, and the custom-op policy is 'keep' (no decomposition)"
        else:
            blocked[op.key] = f"{cannot} and no standard-op decomposition is known (add one to its custom-op package)"
    return Plan(tuple(decompose_), tuple(keep), blocked)


# --- running models that hold custom ops on this host ---------------------------------------------------------

contrib_name = op_packages.contrib_name


def _register_python_ops(entries: Iterable[OpPackageEntry]) -> str:
    """Register the ops with onnxruntime-extensions; returns its custom-op library path."""
    try:
        import onnxruntime_extensions as ext
    except ImportError as err:
        raise ConversionError(
            "running Python custom ops needs onnxruntime-extensions (pip install onnxruntime-extensions)"
        ) from err
    return op_packages.register_python_ops(entries, ext)


def rename_to_contrib(model: onnx.ModelProto, keys: Iterable[str]) -> onnx.ModelProto:
    """A copy whose listed custom ops are addressed as onnxruntime-extensions registers them."""
    from edgefleet.converter.passes.graph import copy_model

    out = copy_model(model)
    op_packages.rename_to_contrib(out, keys)
    _drop_unused_domains(out)
    return out


def _implementations(model: onnx.ModelProto) -> tuple[list[OpDefinition], list[str]]:
    """(Python ops to register, custom-op library paths) for the model's custom ops on this host; ConversionError
    names the ops nothing here implements."""
    known = packages()
    native = ort_native_ops()
    python, libraries, missing = [], [], []
    for op in custom_ops(model):
        entry = known.get(op.key)
        if (op.domain, op.op_type) in native:
            continue
        if entry is not None and entry.compute is not None:
            python.append(entry)
        elif entry is not None and entry.library:
            libraries.append(entry.library)
        else:
            missing.append(op.key)
    if missing:
        raise ConversionError(
            f"custom operators {', '.join(missing)} have no implementation on this host: name their custom-op "
            f"package in ${ENV_VAR} (see models/custom_op/README.md)"
        )
    return python, [find_library(name) for name in dict.fromkeys(libraries)]


def host_session_source(model: onnx.ModelProto) -> tuple[bytes, list[str]]:
    """(model bytes, custom-op libraries to register) so that ONNX Runtime on this host runs `model`.

    ConversionError names the ops nothing here implements."""
    python, paths = _implementations(model)
    if not python:
        return model.SerializeToString(), paths
    library = _register_python_ops(python)
    return rename_to_contrib(model, [e.key for e in python]).SerializeToString(), [library, *paths]


def host_session_path(model_path: Path, work_dir: Path) -> tuple[str, list[str]]:
    """As host_session_source for a model file with external data, which is run from its path: the renamed copy
    is written into `work_dir` with its external data beside it (edgefleet/core/custom_ops/renamed_copy.py)."""
    from edgefleet.core.custom_ops.renamed_copy import renamed_copy

    python, paths = _implementations(onnx.load(str(model_path), load_external_data=False))
    if not python:
        return str(model_path), paths
    library = _register_python_ops(python)
    try:
        copy = renamed_copy(onnx, model_path, [e.key for e in python], work_dir)
    except op_packages.CustomOpPackageError as err:
        raise ConversionError(str(err)) from err
    return str(copy), [library, *paths]


def find_library(name: str) -> str:
    """A compiled custom-op library by file name, from the directories in $EDGEFLEET_CUSTOM_OP_LIBS."""
    found = op_packages.find_library(name)
    if found is None:
        folders = [str(f) for f in op_packages.library_dirs()]
        raise ConversionError(f"custom-op library {name} not found in ${LIBRARY_ENV_VAR} ({folders})")
    return str(found)
