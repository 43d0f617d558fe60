"""Which ONNX Runtime distribution this device has.

The device install does not force one: the PyPI `onnxruntime` (CPU), `onnxruntime-gpu` (CUDA, TensorRT),
NVIDIA's Jetson wheels (also named onnxruntime-gpu), `onnxruntime-openvino`, `onnxruntime-directml` and others all
provide the same `onnxruntime` module, and pip cannot express "any one of them". So the package names none in its
base dependencies (`pip install 'edgefleet[cpu]'` adds the CPU one), and the agent checks at start-up which one it
found, and says so, or refuses to start with the install line for each kind of hardware.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

from edgefleet.core.errors import UserInputError

INSTALL_HINT = (
    "no ONNX Runtime is installed: the agent needs one distribution of it. "
    "A CPU device: pip install 'edgefleet[cpu]'. An NVIDIA GPU: pip install 'edgefleet[gpu]'. "
    "A Jetson: pip install edgefleet, then the Jetson onnxruntime-gpu wheel for your JetPack. "
    "An Intel device: pip install 'edgefleet[cpu,openvino]'"
)


@dataclass(frozen=True)
class OrtDistribution:
    name: str  # the distribution that provides the onnxruntime module, e.g. onnxruntime-gpu
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def find() -> OrtDistribution | None:
    """The installed distribution that provides `import onnxruntime`, or None. Imports nothing."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    names = sorted(importlib.metadata.packages_distributions().get("onnxruntime", []))
    # Plugins (onnxruntime-ep-*) add files under onnxruntime/ too; the runtime itself is the other one.
    runtime = [n for n in names if not n.lower().startswith("onnxruntime-ep-")] or names
    if not runtime:
        return OrtDistribution("onnxruntime (unknown distribution)", "unknown")
    name = runtime[0]
    try:
        return OrtDistribution(name, importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return OrtDistribution(name, "unknown")


def require() -> OrtDistribution:
    """The distribution found; UserInputError with the install line per hardware when there is none."""
    found = find()
    if found is None:
        raise UserInputError(INSTALL_HINT)
    return found
