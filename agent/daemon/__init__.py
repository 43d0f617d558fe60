"""The agent's supervisor: it builds the parts, owns the worker threads and wires them to MQTT; its configuration
and systemd's watchdog.

The CLI uses `Agent` (run until stopped) and `AgentConfig`.
"""

from edgefleet.agent.daemon.config import AgentConfig
from edgefleet.agent.daemon.supervisor import Agent

__all__ = ["Agent", "AgentConfig"]
