"""Serving generative models: Triton's generate and generate_stream and OpenAI's completions and chat on the local
API (streamed as server-sent events), and generation over MQTT with streamed chunks; one gate bounding generations
device-wide, token budgets, and the accounting behind telemetry's GenerationStats and the gen_ai metrics.

Other rooms use `GenerationConfig` (the limits), `GenerationParts` (what every path shares: build one per daemon),
`GenerationAccounting` and `MqttGeneration`.
`MqttGeneration` is imported when first used (paho-mqtt and TLS are not needed to serve over HTTP).
"""

from typing import TYPE_CHECKING

from edgefleet.agent.api.generation.accounting import GenerationAccounting
from edgefleet.agent.api.generation.config import GenerationConfig
from edgefleet.agent.api.generation.gate import GenerationGate
from edgefleet.agent.api.generation.runner import GenerationParts
from edgefleet.core.lazy import lazy_names

if TYPE_CHECKING:
    from edgefleet.agent.api.generation.mqtt import MqttGeneration

_LAZY = {  # imported when first used: not needed to serve (see the module's docstring)
    "MqttGeneration": "edgefleet.agent.api.generation.mqtt",
}

__all__ = ["GenerationAccounting", "GenerationConfig", "GenerationGate", "GenerationParts", "MqttGeneration"]


# Generation over MQTT on first use: serving over HTTP alone never loads paho-mqtt or TLS.
__getattr__ = lazy_names(__name__, _LAZY, globals())
