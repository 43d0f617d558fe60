"""Running a verified bundle: the runtime backends, custom operators, and the execution provider chosen by
measurement.

Other rooms use: `LoadedModel` (a bundle loaded, golden-checked, run), `RuntimeOptions` (how this device loads
bundles), `Policy` (how the provider is chosen), `BenchmarkService` (the device as a benchmark farm), the modules
`backends` and `custom_ops` (what this device can run), and `hardware` / `usable_providers` (status facts).
Importing this room loads no runtime: ONNX Runtime and the optional ones are imported when first used.
"""

from edgefleet.agent.runtime import backends, custom_ops
from edgefleet.agent.runtime.benchmark import BenchmarkService
from edgefleet.agent.runtime.device_facts import hardware, usable_providers
from edgefleet.agent.runtime.model import LoadedModel, RuntimeOptions
from edgefleet.agent.runtime.selection.selector import NoProviderError, Policy

__all__ = [
    "BenchmarkService",
    "LoadedModel",
    "NoProviderError",
    "Policy",
    "RuntimeOptions",
    "backends",
    "custom_ops",
    "hardware",
    "usable_providers",
]
