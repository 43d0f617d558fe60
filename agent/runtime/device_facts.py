"""Facts a device reports about itself in its status: hardware, and the execution providers usable here."""

from __future__ import annotations

import os
import platform
import socket

import psutil

from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.core.messages import Hardware


def usable_providers(model: LoadedModel | None) -> list[str]:
    """What can run here: from the last provider choice (probing every backend would import them all)."""
    if model is None:
        import onnxruntime as ort  # here, not at import: `edgefleet.agent.runtime` must not load ONNX Runtime

        return list(ort.get_available_providers())
    usable = [p for p, why in model.choice.reasons.items() if not why.startswith(("not available", "excluded"))]
    return [model.provider, *usable]


def hardware() -> Hardware:
    return Hardware(
        arch=platform.machine(),
        os=platform.system().lower(),
        cpu_count=os.cpu_count() or 1,
        memory_mb=int(psutil.virtual_memory().total / 2**20),
        hostname=socket.gethostname(),
    )
