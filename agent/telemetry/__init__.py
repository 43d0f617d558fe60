"""What the agent tells the fleet: status, events and telemetry through one disk spool; request statistics and
resources.

Other rooms use `Reporter` (every report the device sends), `Spool` (its disk outbox), `RequestStats` (latency,
errors and failures of the requests served) and `ResourceSampler` (CPU, memory, temperature).
"""

from edgefleet.agent.telemetry.reporter import Reporter, SpoolFigures
from edgefleet.agent.telemetry.spool import Spool
from edgefleet.agent.telemetry.stats import RequestStats, ResourceSampler

__all__ = ["Reporter", "RequestStats", "ResourceSampler", "Spool", "SpoolFigures"]
