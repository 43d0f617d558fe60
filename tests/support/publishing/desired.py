"""Signed desired documents for one slot of devices or groups, as a test publishes them (the control plane's
`rollout start --slot` and `desired set|remove --slot` do the same through its store)."""

from __future__ import annotations

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import DEFAULT_TTL_S, publish_desired
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import Desired, SlotClass
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

ACK_TIMEOUT_S = 10.0


def deploy_slot(
    conn: Connection,
    topics: Topics,
    manifest: Manifest | None,
    *,
    slot: str = DEFAULT_SLOT,
    devices: tuple[str, ...] = (),
    groups: tuple[str, ...] = (),
    rollback: bool = False,
    remove: bool = False,
    keys: HostKeys | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    slot_class: SlotClass = "interactive",
    latency_objective_ms: float | None = None,
) -> Desired:
    """Sign and publish (retained) slot `slot`'s desired state: run `manifest`'s bundle, or (`remove`) stop
    serving the slot, for each device and group."""
    keys = keys or HostKeys.default()
    if remove:
        desired = Desired(slot=slot, bundle_id="", model_name="", model_version="", profile="", remove=True)
    else:
        assert manifest is not None
        desired = Desired(
            slot=slot, bundle_id=manifest.bundle_id, model_name=manifest.model_name,
            model_version=manifest.model_version, profile=manifest.profile, rollback=rollback,
            slot_class=slot_class, latency_objective_ms=latency_objective_ms,
        )  # fmt: skip
    for device in devices:
        publish_desired(conn, topics, keys, desired, device=device, ttl_s=ttl_s, wait=ACK_TIMEOUT_S)
    for group in groups:
        publish_desired(conn, topics, keys, desired, group=group, ttl_s=ttl_s, wait=ACK_TIMEOUT_S)
    return desired


__all__ = ["deploy_slot"]
