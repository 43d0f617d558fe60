"""What the agent tells the fleet: status, events and telemetry through one disk spool; request statistics and
resources.

Other rooms use `Reporter` (every report the device sends), `Spool` (its disk outbox), `RequestStats` (latency,
errors and failures of the requests served; `RequestStats.generation`, a `GenerationWindow`, the token figures of
generations) and `ResourceSampler` (CPU, memory, temperature).
"""

from edgefleet.agent.telemetry.generation_window import GenerationWindow
from edgefleet.agent.telemetry.reporter import Reporter, SpoolFigures
from edgefleet.agent.telemetry.spool import Spool
from edgefleet.agent.telemetry.stats import RequestStats, ResourceSampler

__all__ = ["GenerationWindow", "Reporter", "RequestStats", "ResourceSampler", "Spool", "SpoolFigures"]
