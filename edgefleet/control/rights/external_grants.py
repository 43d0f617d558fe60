"""A grace period for bundle rights the control plane did not grant itself.

`edgefleet deploy` grants a bundle's rights, then publishes the document that names it. A control-plane sync that
read the retained documents between the two would see a right no document names yet. So the sync revokes at once
only what it granted itself and no longer wants; a right someone else granted (a CLI deploy, another control-plane
process before a failover) is kept for `FOREIGN_GRACE_S` while nothing names it, then revoked. A deploy that died
between its grant and its document thus loses the right a minute later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edgefleet.control.rights.dynsec import Acl
from edgefleet.core.topics import Topics

FOREIGN_GRACE_S = 60.0


def held_bundles(topics: Topics, acls: frozenset[Acl]) -> frozenset[str]:
    """The bundles whose topics these ACLs open."""
    prefix = f"{topics.prefix}/bundles/"
    return frozenset(a.topic[len(prefix) :].split("/")[0] for a in acls if a.topic.startswith(prefix))


class ForeignGrace:
    """Which held bundle rights a sync keeps although it does not want them (see the module docstring)."""

    def __init__(self, grace_s: float = FOREIGN_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s, self.clock = grace_s, clock
        self._wanted: dict[str, frozenset[str]] = {}  # device -> the bundles the last sync wanted
        self._first_seen: dict[tuple[str, str], float] = {}  # (device, foreign bundle) -> when first seen unwanted

    def kept(self, device_id: str, held: frozenset[str], wanted: frozenset[str]) -> frozenset[str]:
        """The foreign, unwanted bundles still inside their grace; records `wanted` as this sync's."""
        now = self.clock()
        ours = self._wanted.get(device_id, frozenset())
        for key in [k for k in self._first_seen if k[0] == device_id and (k[1] not in held or k[1] in wanted)]:
            del self._first_seen[key]
        kept = set()
        for bundle in held - wanted - ours:
            if now - self._first_seen.setdefault((device_id, bundle), now) < self.grace_s:
                kept.add(bundle)
        self._wanted[device_id] = wanted
        return frozenset(kept)


__all__ = ["FOREIGN_GRACE_S", "ForeignGrace", "held_bundles"]
