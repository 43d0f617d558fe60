"""The local inference API: HTTP/1.1 (edgefleet's /v1 and the Open Inference Protocol), request bodies checked before
they are parsed, /metrics, and inference over MQTT.

Other rooms use `InferenceService` (the HTTP server and the models it serves), its `ServiceConfig` and
`ServiceMetrics`, `MqttInference` (requests over MQTT, answered on their own thread), and for generative models
`GenerationConfig`, `GenerationParts` (the gate and accounting every generation path shares) and `MqttGeneration`
(agent/api/generation/).
The MQTT paths are imported when first used (`MqttInference`, `MqttGeneration`): serving over HTTP alone
loads neither paho-mqtt nor TLS (bench/serve.py's idle RSS).
"""

from typing import TYPE_CHECKING

from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.generation import GenerationConfig, GenerationParts
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.api.service import InferenceService
from edgefleet.core.lazy import lazy_names

if TYPE_CHECKING:
    from edgefleet.agent.api.generation.mqtt import MqttGeneration
    from edgefleet.agent.api.mqtt import InferenceTarget, MqttInference

_LAZY = {  # imported when first used: not needed to serve (see the module's docstring)
    "MqttGeneration": "edgefleet.agent.api.generation.mqtt",
    "MqttInference": "edgefleet.agent.api.mqtt",
    "InferenceTarget": "edgefleet.agent.api.mqtt",
}

__all__ = [
    "GenerationConfig",
    "GenerationParts",
    "InferenceService",
    "InferenceTarget",
    "MqttGeneration",
    "MqttInference",
    "ServiceConfig",
    "ServiceMetrics",
]


# The MQTT paths on first use: a process that only serves HTTP never loads paho, TLS or the quality room.
__getattr__ = lazy_names(__name__, _LAZY, globals())
