"""Unpublishing a bundle from the broker, unless desired state still names it.

Retained bundles cost broker memory and disk forever (every version, every recipe). Unpublishing clears a bundle's
retained offer and the chunks no other retained offer lists (control/publish/chunks.py `unpublish_bundle`). A bundle
that a retained desired document of any slot still names (as the bundle to run, the shadow, or the allowed
downgrade) is refused: a device that has not fetched it yet would wait for chunks that no longer exist. The
documents are read unverified: they only decide what to keep, never what a device runs.
"""

from __future__ import annotations

import json

from edgefleet.control.broker.retained import read_retained
from edgefleet.control.publish.chunks import READ_TIMEOUT_S, unpublish_bundle
from edgefleet.core.errors import BrokerError, UserInputError
from edgefleet.core.messages import MessageError, SignedDesired, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics


def desired_references(conn: Connection, topics: Topics, timeout: float = READ_TIMEOUT_S) -> dict[str, list[str]]:
    """bundle id -> the retained desired topics that name it (to run, as shadow, or as the allowed downgrade)."""
    legacy = [f"{topics.prefix}/devices/+/desired", f"{topics.prefix}/groups/+/desired"]  # not yet migrated
    filters = [*legacy, *(f + "/+" for f in legacy)]  # every slot's document
    found, complete = read_retained(conn, topics.prefix, filters, timeout)
    if not complete:
        raise BrokerError(f"could not read the retained desired state within {timeout:g} s")
    named: dict[str, list[str]] = {}
    for topic, payload in sorted(found.items()):
        try:
            document = json.loads(decode(SignedDesired, payload).desired.payload)
        except (MessageError, ValueError):
            continue  # not a document a device would act on
        if not isinstance(document, dict):
            continue
        for field in ("bundle_id", "shadow_bundle_id", "allow_downgrade_to"):
            value = document.get(field)
            if isinstance(value, str) and value:
                named.setdefault(value, []).append(topic)
    return named


def unpublish(conn: Connection, topics: Topics, bundle_id: str, *, force: bool = False) -> list[str]:
    """Clear the bundle's offer and its chunks no other offer lists; the chunks cleared. UserInputError when
    desired state still names the bundle (unless `force`)."""
    users = desired_references(conn, topics).get(bundle_id, [])
    if users and not force:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        raise UserInputError(
            f"{bundle_id} is still named by desired state on {shown}; deploy something else first (or --force)"
        )
    return unpublish_bundle(conn, topics, bundle_id)


__all__ = ["desired_references", "unpublish"]
