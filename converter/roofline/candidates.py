"""The roofline of each candidate a search built: its own artifact's work (the ONNX graph it ships or the proxy
this host runs, or its OpenVINO IR), its measured latency, and this machine's limits at the timing's threads."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from edgefleet.converter.roofline.limits import MachineLimits
from edgefleet.converter.roofline.roofline import judged
from edgefleet.converter.roofline.work import Work, onnx_work, openvino_work

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Artifact:
    """What a candidate runs, as the roofline reads it."""

    name: str
    runtime: str
    graph: Path | onnx.ModelProto | object  # an .onnx file or graph, an OpenVINO .xml, or an ov.Model
    latency_ms: float | None
    hint: str | None = None  # OpenVINO's inference precision hint as compiled


def effective_hint(hint: str | None, device: str = "CPU") -> str:
    """The precision OpenVINO's CPU plugin computes float ops at: its default is bf16 where the CPU has it, and an
    f16 hint on CPU runs f32 (converter.runners.openvino_runner)."""
    if hint == "f16" and device == "CPU":
        return "f32"
    if hint:
        return hint
    try:
        import openvino as ov

        return "bf16" if "BF16" in ov.Core().get_property(device, "OPTIMIZATION_CAPABILITIES") else "f32"
    except Exception:  # no OpenVINO here: nothing runs at its default
        return "f32"


def work_of(artifact: Artifact, feeds: Mapping[str, np.ndarray]) -> Work:
    graph = artifact.graph
    if isinstance(graph, Path) and graph.suffix == ".xml":
        import openvino as ov

        return openvino_work(ov.Core().read_model(str(graph)), feeds, effective_hint(artifact.hint))
    if isinstance(graph, Path):
        return onnx_work(onnx.load(str(graph)), feeds)
    if isinstance(graph, onnx.ModelProto):
        return onnx_work(graph, feeds)
    return openvino_work(graph, feeds, effective_hint(artifact.hint))  # an ov.Model


def rooflines(
    artifacts: Sequence[Artifact], feeds: Mapping[str, np.ndarray], limits: MachineLimits | None
) -> dict[str, dict[str, object]]:
    """Each candidate's roofline by name (see `judge`)."""
    return judge(artifacts, feeds, limits)[0]


def judge(
    artifacts: Sequence[Artifact], feeds: Mapping[str, np.ndarray], limits: MachineLimits | None
) -> tuple[dict[str, dict[str, object]], MachineLimits | None]:
    """Each candidate's roofline (work and achieved rates only where `limits` is None: the latency was measured
    elsewhere), by name, and the limits they were set against: `limits` with every peak a candidate beat raised to
    what it achieved (so no candidate is above 100 %, and all are judged against the same figures). A candidate
    whose graph cannot be read says why instead."""
    out: dict[str, dict[str, object]] = {}
    works = {}
    for artifact in artifacts:
        try:
            works[artifact.name] = work_of(artifact, feeds)
        except Exception as err:  # an artifact a reader cannot parse: the report says so, the conversion goes on
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            out[artifact.name] = {"error": f"work not counted: {first}"}
            log.info("roofline of %s: %s", artifact.name, first)
    if limits is None:
        for artifact in artifacts:
            if artifact.name not in works:
                continue
            work = works[artifact.name]
            seconds = artifact.latency_ms / 1e3 if artifact.latency_ms else None
            out[artifact.name] = {
                "work": work.as_dict(), "latency_ms": artifact.latency_ms,
                "achieved_gops": work.flops / seconds / 1e9 if seconds else None,
                "achieved_gbs": work.bytes_moved / seconds / 1e9 if seconds else None,
                "limit_pct": None, "bound": None,
            }  # fmt: skip
        return out, None
    raised: dict[str, list[str]] = {}
    for artifact in artifacts:  # first: which peaks a candidate beat
        if artifact.name in works:
            line, raises = judged(works[artifact.name], artifact.runtime, limits, artifact.latency_ms, artifact.name)
            if raises:
                raised[artifact.name] = line.raised
                limits = limits.raised_to(raises)
                log.info("roofline: %s", "; ".join(line.raised))
    for artifact in artifacts:  # then every candidate against the same (raised) figures
        if artifact.name in works:
            line, _ = judged(works[artifact.name], artifact.runtime, limits, artifact.latency_ms, artifact.name)
            out[artifact.name] = replace(line, raised=raised.get(artifact.name, [])).as_dict()
    return out, limits
