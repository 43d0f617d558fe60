"""The host-side converter: ONNX model in, one signed bundle per hardware profile out.

The public API, what the CLI, the control plane and benchmarks use: `convert(ConvertRequest)` → a
`ProfileResult` per profile (with a `Farm`, devices measure the candidates), `inspect_model`, `load_model`, and
the phase clocks and progress events a caller listens to (`recording`, `listening`, `PHASES`). Names are
imported on first use, so `import edgefleet.converter` stays cheap for a CLI that only lists commands.

Rooms (each with its own public API): `search` (plan, build, judge, time, choose), `passes` (graph, precision
and export passes), `metrics` (task metrics), `timing` (interleaved latency, pruning, head to head), `report`, and
`generative` (language models: `convert` sends it a model directory or an ONNX with past key/value inputs).
Never imported by the agent (a test proves it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgefleet.converter.conversion import convert
    from edgefleet.converter.inspection import InspectReport, inspect_model
    from edgefleet.converter.model import SourceModel, load_model
    from edgefleet.converter.phases import PHASES, PhaseClock, listening, recording, step
    from edgefleet.converter.request import ConvertRequest, ProfileResult
    from edgefleet.converter.search import Farm, Progress

_WHERE = {
    "convert": "conversion",
    "ConvertRequest": "request",
    "ProfileResult": "request",
    "Farm": "search",
    "Progress": "search",
    "InspectReport": "inspection",
    "inspect_model": "inspection",
    "SourceModel": "model",
    "load_model": "model",
    "PHASES": "phases",
    "PhaseClock": "phases",
    "listening": "phases",
    "recording": "phases",
    "step": "phases",
}
__all__ = [
    "PHASES",
    "ConvertRequest",
    "Farm",
    "InspectReport",
    "PhaseClock",
    "ProfileResult",
    "Progress",
    "SourceModel",
    "convert",
    "inspect_model",
    "listening",
    "load_model",
    "recording",
    "step",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its API: {', '.join(__all__)}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
