"""Moving retained desired documents from the single-model topics to the per-slot ones (issue 33).

A control plane from before slots kept each target's document retained on `devices/{id}/desired` or
`groups/{g}/desired`; devices now listen on `.../desired/{slot}` only. At start the control plane re-publishes each
document it finds on a legacy topic, byte for byte, on the default slot's topic (`.../desired/default`): the same
signed bytes, so the same counter, expiry and signature (a legacy document carries no slot, which reads as
`default`, the slot of its new topic). Only then does it clear the legacy topic (an empty retained message). A
default-slot topic that already holds a document keeps it: that one is newer. Run again, it finds nothing to do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edgefleet.control.broker.retained import read_retained
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 15.0
ACK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LegacyMigration:
    moved: list[str] = field(default_factory=list)  # legacy topics whose document now sits on the default slot
    kept: list[str] = field(default_factory=list)  # legacy topics whose default slot already held a document
    cleared: list[str] = field(default_factory=list)  # legacy topics cleared


def _filters(topics: Topics) -> list[str]:
    return [f"{topics.prefix}/devices/+/desired", f"{topics.prefix}/groups/+/desired"]


def _slot_topic(topics: Topics, legacy: str) -> str | None:
    """The default slot's topic for a legacy desired topic, or None when `legacy` is not one."""
    parts = legacy[len(topics.prefix) + 1 :].split("/")
    if not legacy.startswith(topics.prefix + "/") or len(parts) != 3 or parts[2] != "desired":
        return None
    kind, name = parts[0], parts[1]
    try:
        if kind == "devices":
            return topics.device_desired(name, DEFAULT_SLOT)
        if kind == "groups":
            return topics.group_desired(name, DEFAULT_SLOT)
    except ValueError:
        return None
    return None


def migrate_legacy_desired(conn: Connection, topics: Topics, timeout: float = READ_TIMEOUT_S) -> LegacyMigration:
    """Move every retained legacy document to its default slot's topic, then clear the legacy topic. BrokerError
    when the broker does not deliver the retained documents or acknowledge a publish in time (nothing is cleared
    whose document was not first published on its new topic)."""
    found, complete = read_retained(conn, topics.prefix, _filters(topics), timeout)
    if not complete:
        raise BrokerError(f"could not read the retained desired state within {timeout:g} s; legacy documents stay")
    report = LegacyMigration()
    moves = {legacy: new for legacy in sorted(found) if (new := _slot_topic(topics, legacy)) is not None}
    if not moves:
        return report  # the usual case after the first start: one round trip, nothing read
    present, complete = read_retained(conn, topics.prefix, sorted(set(moves.values())), timeout)
    if not complete:
        raise BrokerError(f"could not read the default slots' documents within {timeout:g} s; legacy documents stay")
    for legacy, new in moves.items():
        payload = found[legacy]
        if new in present:
            report.kept.append(legacy)
        else:
            conn.publish_latest(new, payload, qos=1, wait=ACK_TIMEOUT_S)
            report.moved.append(legacy)
        conn.publish_latest(legacy, b"", qos=1, wait=ACK_TIMEOUT_S)
        report.cleared.append(legacy)
    if report.cleared:
        log.info(
            "moved %d legacy desired document(s) to the default slot, kept %d newer ones, cleared %d legacy topics",
            len(report.moved), len(report.kept), len(report.cleared),
        )  # fmt: skip
    return report
