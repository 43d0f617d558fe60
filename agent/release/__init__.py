"""The agent's own update (docs/agent.md, "Agent updates"): fetch a signed agent release named by the signed desired
state, verify it, build its environment offline and hand over to the launcher (edgefleet/launcher/); on trial, pass
the health gate; afterwards, report what the launcher decided.
"""

from edgefleet.agent.release.environment import build_environment
from edgefleet.agent.release.health_gate import HealthGate
from edgefleet.agent.release.updater import ReleaseUpdater

__all__ = ["HealthGate", "ReleaseUpdater", "build_environment"]
