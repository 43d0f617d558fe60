"""THE one way the host publishes desired state: signed by the ops key, bound to its target, counted, expiring.

Desired state is per slot (a model a device runs; a single model runs in slot `default`): a document is published on
its own slot's topic (`devices/{id}/desired/{slot}`, `groups/{g}/desired/{slot}`) and a device accepts it only there,
so re-signing one slot never touches another slot's retained document.

Everything that tells a device or a group what to run (`deploy`, the control plane's `DesiredPublisher`, the
rollout engine through it, the demo) calls `publish_desired`. The document carries:
- `target`: `device:<id>` or `group:<name>`; a device refuses it on any other topic;
- `counter`: from `HostKeys.next_counter` (max(previous + 1, time in ms), persisted before use), so it grows
  across control-plane restarts; a device refuses a counter below the highest it has seen for that target;
- `expires_at`: after it, with no newer document, the device reports its desired state stale;
- `allow_downgrade_to`: the exact bundle id this document allows below the device's version floor (a rollback
  is an explicit signed decision; nothing unsigned can make one).
The root-signed key set rides along, so a device learns of a rotated or revoked key without a visit.

Clearing is signed too (`clear_desired`): a `Desired` with `clear=True` and no bundle, counted and bound like any
other; it withdraws this target's document for the slot (a group's may then apply). Removing a slot is a different
decision (`remove_desired`): `remove=True` tells the device to stop serving the slot and unload it. A device
ignores an empty (unsigned) message on a desired topic: it keeps the document in force, its bundle and its floor
(agent/install/desired.py).
"""

from __future__ import annotations

import time

import paho.mqtt.client as paho

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.core.messages import Desired, SignedDesired, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics, check_segment
from edgefleet.core.trust.keyset import sign_payload

DEFAULT_TTL_S = 7 * 86400.0


def device_target(device_id: str) -> str:
    return f"device:{check_segment('device id', device_id)}"


def group_target(group: str) -> str:
    return f"group:{check_segment('group', group)}"


def sign_desired(keys: HostKeys, desired: Desired, target: str, *, ttl_s: float = DEFAULT_TTL_S) -> SignedDesired:
    """`desired` bound to `target`, with a fresh counter and expiry, signed by the ops key."""
    bound = desired.model_copy(
        update={
            "target": target,
            "counter": keys.next_counter(),
            "expires_at": round(time.time() + ttl_s, 3),
            "allow_downgrade_to": desired.bundle_id if desired.rollback else desired.allow_downgrade_to,
        }
    )
    return SignedDesired(
        desired=sign_payload("desired", Desired.model_validate(bound.model_dump()).model_dump_json(), keys.ops_key()),
        keyset=keys.keyset(),
    )


def publish_desired(
    conn: Connection,
    topics: Topics,
    keys: HostKeys,
    desired: Desired,
    *,
    device: str | None = None,
    group: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait: float | None = None,
) -> paho.MQTTMessageInfo:
    """Sign `desired` for exactly one device or group and publish it retained on that target's topic for the
    document's slot (`desired.slot`)."""
    if (device is None) == (group is None):
        raise ValueError("publish_desired needs exactly one of device= or group=")
    if device is not None:
        topic, target = topics.device_desired(device, desired.slot), device_target(device)
    else:
        assert group is not None
        topic, target = topics.group_desired(group, desired.slot), group_target(group)
    signed = sign_desired(keys, desired, target, ttl_s=ttl_s)
    return conn.publish_latest(topic, signed.encode(), qos=1, wait=wait)  # a replay never leaves an older one


def unverified_desired(payload: bytes) -> Desired:
    """The `Desired` inside a signed document, WITHOUT checking the signature: for host-side readers (the
    simulated fleet, displays) only. Devices verify (agent/install/desired.py). MessageError when malformed."""
    return decode(Desired, decode(SignedDesired, payload).desired.payload.encode())


def clear_desired(
    conn: Connection,
    topics: Topics,
    keys: HostKeys,
    *,
    slot: str = DEFAULT_SLOT,
    device: str | None = None,
    group: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait: float | None = None,
) -> paho.MQTTMessageInfo:
    """A signed "no desired state" for one slot of one device or group, retained on its topic (the device forgets
    the target's document for the slot; its own keeps what it runs, or falls back to its group's)."""
    none = Desired(slot=slot, bundle_id="", model_name="", model_version="", profile="", clear=True)
    return publish_desired(conn, topics, keys, none, device=device, group=group, ttl_s=ttl_s, wait=wait)


def removal(slot: str) -> Desired:
    """The decision that a slot runs nothing: the device drains it, unloads it and forgets its files."""
    return Desired(slot=slot, bundle_id="", model_name="", model_version="", profile="", remove=True)


def remove_desired(
    conn: Connection,
    topics: Topics,
    keys: HostKeys,
    *,
    slot: str,
    device: str | None = None,
    group: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait: float | None = None,
) -> paho.MQTTMessageInfo:
    """A signed removal of one slot for one device or group, retained on the slot's topic."""
    return publish_desired(conn, topics, keys, removal(slot), device=device, group=group, ttl_s=ttl_s, wait=wait)
