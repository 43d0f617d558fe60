"""Running a verified bundle: the runtime backends, custom operators, and the execution provider chosen by
measurement.

Other rooms use: `LoadedModel` (a bundle loaded, golden-checked, run), `RuntimeOptions` (how this device loads
bundles), `Policy` (how the provider is chosen), `BenchmarkService` (the device as a benchmark farm), the modules
`backends` and `custom_ops` (what this device can run), and `hardware` / `usable_providers` / `native_code` (status
facts: `native_code.loads()` lists every native library the agent loaded).
Importing this room loads no runtime: ONNX Runtime and the optional ones are imported when first used.
`BenchmarkService` is imported when first used: it speaks MQTT (paho, TLS), which serving a model never needs.
"""

from typing import TYPE_CHECKING

from edgefleet.agent.runtime import backends, custom_ops, native_code
from edgefleet.agent.runtime.device_facts import hardware, usable_providers
from edgefleet.agent.runtime.model import LoadedModel, RuntimeOptions
from edgefleet.agent.runtime.selection.selector import NoProviderError, Policy
from edgefleet.core.lazy import lazy_names

if TYPE_CHECKING:
    from edgefleet.agent.runtime.benchmark import BenchmarkService

_LAZY = {  # imported when first used: not needed to serve (see the module's docstring)
    "BenchmarkService": "edgefleet.agent.runtime.benchmark",
}

__all__ = [
    "BenchmarkService",
    "LoadedModel",
    "NoProviderError",
    "Policy",
    "RuntimeOptions",
    "backends",
    "custom_ops",
    "hardware",
    "native_code",
    "usable_providers",
]


# The benchmark farm on first use: it speaks MQTT, and serving a model never needs it.
__getattr__ = lazy_names(__name__, _LAZY, globals())
