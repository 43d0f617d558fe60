"""Serving generative models: Triton's generate and generate_stream and OpenAI's completions and chat on the local
API (streamed as server-sent events), and generation over MQTT with streamed chunks; one gate bounding generations
device-wide, token budgets, and the accounting behind telemetry's GenerationStats and the gen_ai metrics.

Other rooms use `GenerationConfig` (the limits), `GenerationParts` (what every path shares: build one per daemon),
`GenerationAccounting` and `MqttGeneration`.
"""

from edgefleet.agent.api.generation.accounting import GenerationAccounting
from edgefleet.agent.api.generation.config import GenerationConfig
from edgefleet.agent.api.generation.gate import GenerationGate
from edgefleet.agent.api.generation.mqtt import MqttGeneration
from edgefleet.agent.api.generation.runner import GenerationParts

__all__ = ["GenerationAccounting", "GenerationConfig", "GenerationGate", "GenerationParts", "MqttGeneration"]
