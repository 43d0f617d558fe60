"""What the install worker is asked to do: typed commands on its queue, each handled on its one thread.

The install worker is the one writer of the device's state (what it serves, its state, its last error), so every
change arrives here as a command instead of being made by the thread that noticed it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reconcile:
    """Bring the device to the signed desired state in force (a new document, a reconnect, a retry)."""


@dataclass(frozen=True)
class Unhealthy:
    """The health monitor judged `bundle_id`, the bundle being served, unhealthy: roll back if allowed."""

    bundle_id: str
    reason: str


@dataclass(frozen=True)
class Repartition:
    """The slot's share of the device's cores changed (a slot arrived or left): load with `threads` intra-op threads
    from now on, and reload what the slot serves with them (a hot swap of the same bundle: no commit, no event)."""

    threads: int
    why: str


@dataclass(frozen=True)
class Stop:
    """Leave the loop: the agent is shutting down."""


Command = Reconcile | Unhealthy | Repartition | Stop

__all__ = ["Command", "Reconcile", "Repartition", "Stop", "Unhealthy"]
