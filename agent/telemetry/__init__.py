"""What the agent tells the fleet: status, events and telemetry through one disk spool; request statistics and
resources.

Other rooms use `Reporter` (every report the device sends), `Spool` (its disk outbox), `RequestStats` (latency,
errors and failures of the requests served; `RequestStats.generation`, a `GenerationWindow`, the token figures of
generations) and `ResourceSampler` (CPU, memory, temperature).
`Reporter`, `SpoolFigures` and `Spool` are imported when first used (sqlite3, MQTT): the local API needs only
`RequestStats`.
"""

from typing import TYPE_CHECKING

from edgefleet.agent.telemetry.generation_window import GenerationWindow
from edgefleet.agent.telemetry.stats import RequestStats, ResourceSampler
from edgefleet.core.lazy import lazy_names

if TYPE_CHECKING:
    from edgefleet.agent.telemetry.reporter import Reporter, SlotReporter, SpoolFigures
    from edgefleet.agent.telemetry.spool import Spool

_LAZY = {  # imported when first used: not needed to serve (see the module's docstring)
    "Reporter": "edgefleet.agent.telemetry.reporter",
    "SlotReporter": "edgefleet.agent.telemetry.reporter",
    "SpoolFigures": "edgefleet.agent.telemetry.reporter",
    "Spool": "edgefleet.agent.telemetry.spool",
}

__all__ = [
    "GenerationWindow", "Reporter", "RequestStats", "ResourceSampler", "SlotReporter", "Spool", "SpoolFigures",
]  # fmt: skip


# The reporter and its spool on first use: the local API needs only RequestStats.
__getattr__ = lazy_names(__name__, _LAZY, globals())
