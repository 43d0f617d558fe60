"""The local inference API: HTTP/1.1 (edgefleet's /v1 and the Open Inference Protocol), request bodies checked before
they are parsed, /metrics, and inference over MQTT.

Other rooms use `InferenceService` (the HTTP server and the models it serves), its `ServiceConfig` and
`ServiceMetrics`, `MqttInference` (requests over MQTT, answered on their own thread), and for generative models
`GenerationConfig`, `GenerationParts` (the gate and accounting every generation path shares) and `MqttGeneration`
(agent/api/generation/).
"""

from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.generation import GenerationConfig, GenerationParts, MqttGeneration
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.api.mqtt import MqttInference
from edgefleet.agent.api.service import InferenceService

__all__ = [
    "GenerationConfig",
    "GenerationParts",
    "InferenceService",
    "MqttGeneration",
    "MqttInference",
    "ServiceConfig",
    "ServiceMetrics",
]
