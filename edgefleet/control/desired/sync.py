"""Desired state, materialised: each device's resolved deployment of each slot becomes its retained
`desired/{slot}` topic.

Per slot (a model the device runs; a single model is slot `default`): the plan resolves every (device, slot) on its
own, and a document is re-signed and published only when that slot's decision changed (or is due for re-signing),
so publishing one slot never re-publishes another's retained document (its bytes and counter stay as they were).
A slot removal (`desired remove --slot S`) resolves like any deployment and is published as a signed
`Desired.remove`.

Host-side groups and label selectors exist only on the host, and agents take a device's own desired
topic over any group topic; so the control plane resolves every device (`registry.resolve_desired`) and
publishes the result per device, retained, signed by the ops key (`desired_signing.publish_desired`). It
remembers what it published (in the store) and publishes again when the bundle or the rollback flag changes (or the
registry's link cap for the device, `devices enroll --max-bytes-per-s`, which this process remembers), and
re-signs (same decision, same `issued_at`, new counter and expiry) once half of a document's lifetime has passed,
so devices never see it go stale while the control plane runs. Keeping `issued_at` means a re-signed document
does not make an agent retry a bundle it refused. A device whose deployments all went away gets a signed "no
desired state" document on its topic (devices ignore an unsigned empty message).
Devices the control plane never published to are left alone (they may be managed with `edgefleet deploy`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import paho.mqtt.client as paho

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import DEFAULT_TTL_S, clear_desired, publish_desired, removal
from edgefleet.control.fleet.registry import link_cap, memberships, resolve_desired, resolve_slot_policy
from edgefleet.control.health import LoopHealth
from edgefleet.control.rights.documents import DesiredWatch, load_root
from edgefleet.control.rights.sync import BrokerRights, NoBrokerRights, device_grants
from edgefleet.control.store import (
    AgentReleaseTarget,
    Deployment,
    DeviceRecord,
    PublishedDesired,
    SlotKey,
    SlotPolicy,
    Store,
)
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import AgentRelease, Desired, SlotClass
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 30.0
IN_FLIGHT_S = 120.0  # after this an unacknowledged publish is given up (a lost session) and published again


@dataclass(frozen=True)
class SyncReport:
    published: list[str]
    cleared: list[str]


def plan_desired(store: Store, devices: list[DeviceRecord] | None = None) -> dict[SlotKey, Deployment | None]:
    """(device id, slot) → the deployment that applies to that slot of the device now (None: none does), for
    every device and every slot some deployment names (the default slot always)."""
    return plan_slots(store, devices)[0]


def plan_slots(
    store: Store, devices: list[DeviceRecord] | None = None
) -> tuple[dict[SlotKey, Deployment | None], dict[SlotKey, SlotPolicy | None]]:
    """`plan_desired`, and the policy (class, latency objective) that applies to each of those slots."""
    devices = store.devices() if devices is None else devices
    groups = store.groups()
    deployments, policies = store.deployments(), store.slot_policies()
    extra = {d.target for d in deployments if d.scope == "group"} | {p.target for p in policies if p.scope == "group"}
    member = memberships(groups, devices, extra)
    slots = sorted({DEFAULT_SLOT, *(d.slot for d in deployments)})
    keys = [(d, slot) for d in devices for slot in slots]
    return (
        {(d.device_id, slot): resolve_desired(d, deployments, groups, member[d.device_id], slot) for d, slot in keys},
        {(d.device_id, slot): resolve_slot_policy(d, policies, groups, member[d.device_id], slot) for d, slot in keys},
    )


def scheduling(policy: SlotPolicy | None) -> tuple[SlotClass, float | None]:
    """(class, latency objective) a slot's document carries: its policy's, or an interactive slot's."""
    return ("interactive", None) if policy is None else (policy.slot_class, policy.latency_objective_ms)


def device_plan(plan: Mapping[SlotKey, Deployment | None], device_id: str) -> dict[str, Deployment]:
    """slot → the deployment that applies, for one device (slots resolved to nothing left out)."""
    return {slot: want for (device, slot), want in plan.items() if device == device_id and want is not None}


def agent_release(target: AgentReleaseTarget) -> AgentRelease:
    """The reference a desired document carries for the agent release the store names for a device."""
    return AgentRelease(
        release_id=target.release_id, version=target.version, allow_downgrade_to=target.allow_downgrade_to
    )


def _what(d: Deployment | PublishedDesired, policy: tuple[SlotClass, float | None]) -> tuple[object, ...]:
    """What a device is told: a change to any of it is published again."""
    return d.bundle_id, d.rollback, d.shadow_bundle_id, d.remove, *policy


def _told(p: PublishedDesired) -> tuple[object, ...]:
    return _what(p, (p.slot_class, p.latency_objective_ms))


class DesiredPublisher:
    """Publishes desired state. A publish the broker has not acknowledged yet stays in flight (for up to
    `IN_FLIGHT_S`) and is not published again by the next sync: under load (thousands of devices after a group
    change) re-publishing everything unacknowledged would queue ever more copies behind the first."""

    rights: BrokerRights = NoBrokerRights("no rights manager configured")  # the control plane sets its own
    watch: DesiredWatch | None = None  # the retained documents rights also follow (made on the first managed sync)
    rights_health: LoopHealth | None = None  # the broker-rights sync's record (the control plane sets its own)

    def __init__(
        self, conn: Connection, topics: Topics, store: Store, keys: HostKeys | None = None, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.conn, self.topics, self.store = conn, topics, store
        self.keys, self.ttl_s = keys or HostKeys.default(), ttl_s
        self._signed_at: dict[SlotKey, float] = {}  # when each slot's document was last signed (this process)
        self._in_flight: dict[SlotKey, tuple[PublishedDesired | None, paho.MQTTMessageInfo, float]] = {}
        self._cap_sent: dict[SlotKey, int | None] = {}  # the link cap in its last signed document (this process)
        self._release_sent: dict[SlotKey, AgentRelease | None] = {}  # the agent release in it (this process)

    def _flying(self, key: SlotKey) -> tuple[bool, PublishedDesired | None]:
        """(something is on its way to the slot, what: a record, or None for a clear)."""
        flying = self._in_flight.get(key)
        if flying is None or time.monotonic() - flying[2] > IN_FLIGHT_S:
            return False, None
        return True, flying[0]

    def sync(self) -> SyncReport:
        """Publish what changed since the last sync; returns the devices published to and cleared."""
        devices = self.store.devices()
        plan, policies = plan_slots(self.store, devices)
        caps = {d.device_id: link_cap(d) for d in devices}
        releases = {device: agent_release(t) for device, t in self.store.agent_releases().items()}
        if self.rights.managed:  # first: no device hears of a bundle it may not read (broker_rights.py)
            self.watch = self.watch or DesiredWatch(self.conn, self.topics, load_root(self.keys.root_public()))
            try:
                self.rights.follow(device_grants(self.store, plan, self.watch.documents()))
            except Exception as err:  # nothing is published this time: no device hears of a bundle it cannot read
                if self.rights_health is not None:
                    self.rights_health.failed(time.time(), f"broker-rights sync: {err}")
                raise
            if self.rights_health is not None:
                self.rights_health.ticked(time.time())
        published = self.store.published()
        for key in sorted(set(plan) | {k for k in published if k[0] in caps}):
            device_id, slot = key
            want, have = plan.get(key), published.get(key)
            in_flight, flying = self._flying(key)
            if want is None:
                if have is not None and not (in_flight and flying is None):
                    info = clear_desired(
                        self.conn, self.topics, self.keys, slot=slot, device=device_id, ttl_s=self.ttl_s
                    )
                    self._in_flight[key] = (None, info, time.monotonic())
                continue
            fresh = time.time() - self._signed_at.get(key, 0.0) < self.ttl_s / 2
            cap = caps.get(device_id)
            release = releases.get(device_id)  # named in every slot's document: the newest decision counts
            same_cap = key in self._cap_sent and self._cap_sent[key] == cap and self._release_sent.get(key) == release
            policy = scheduling(policies.get(key))
            if have is not None and _told(have) == _what(want, policy) and fresh and same_cap:
                continue
            if flying is not None and _told(flying) == _what(want, policy) and same_cap:
                continue  # on its way
            # The same decision on the served bundle keeps its issued_at: a refused bundle is not retried.
            same = have is not None and (have.bundle_id, have.rollback, have.remove) == (
                want.bundle_id, want.rollback, want.remove
            )  # fmt: skip
            desired = (
                removal(slot).model_copy(update={"max_bytes_per_s": cap, "agent_release": release})
                if want.remove
                else Desired(
                    slot=slot,
                    bundle_id=want.bundle_id,
                    model_name=want.model_name,
                    model_version=want.model_version,
                    profile=want.profile,
                    rollback=want.rollback,
                    shadow_bundle_id=want.shadow_bundle_id,
                    max_bytes_per_s=cap,
                    slot_class=policy[0],
                    latency_objective_ms=policy[1],
                    agent_release=release,
                )
            )
            if same and have is not None:
                desired = desired.model_copy(update={"issued_at": have.issued_at})
            info = publish_desired(self.conn, self.topics, self.keys, desired, device=device_id, ttl_s=self.ttl_s)
            self._signed_at[key], self._cap_sent[key], self._release_sent[key] = time.time(), cap, release
            sent = PublishedDesired(
                device_id, want.bundle_id, want.rollback, desired.issued_at, want.shadow_bundle_id, slot, want.remove,
                *policy,
            )  # fmt: skip
            self._in_flight[key] = (sent, info, time.monotonic())
        report = SyncReport([], [])
        deadline = time.monotonic() + ACK_TIMEOUT_S
        acked: list[tuple[SlotKey, PublishedDesired | None]] = []
        try:
            for key, (record, info, _) in list(self._in_flight.items()):
                if not info.is_published():
                    with contextlib.suppress(RuntimeError, ValueError):  # not sent yet (disconnected): paho resends
                        info.wait_for_publish(max(0.0, deadline - time.monotonic()))
                if info.is_published():
                    acked.append((key, record))
                    del self._in_flight[key]
        finally:
            self.store.set_published_many(acked)  # one transaction for all (5,000 devices after a group change)
        for (device_id, slot), record in acked:
            name = device_id if slot == DEFAULT_SLOT else f"{device_id}/{slot}"
            (report.published if record else report.cleared).append(name)
            if record and record.remove:
                log.info("desired for %s: slot %s removed", device_id, slot)
            elif record:
                shadow = f" (shadow {record.shadow_bundle_id})" if record.shadow_bundle_id else ""
                rollback = " (rollback)" if record.rollback else ""
                log.info("desired for %s slot %s: %s%s%s", device_id, slot, record.bundle_id, rollback, shadow)
            else:
                log.info("desired for %s slot %s cleared", device_id, slot)
        if self._in_flight:
            first = "/".join(min(self._in_flight))
            raise BrokerError(
                f"the broker did not acknowledge the desired bundle of {len(self._in_flight)} device slot(s) within "
                f"{ACK_TIMEOUT_S:g} s (first: {first}); the next sync waits for them"
            )
        return report
