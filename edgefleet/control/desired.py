"""Desired state, materialised: each device's resolved deployment becomes its retained `desired` topic.

Host-side groups and label selectors exist only on the host, and agents take a device's own desired
topic over any group topic; so the control plane resolves every device (`registry.resolve_desired`) and
publishes the result per device, retained. It remembers what it published (in the store) and publishes
again only when the bundle or the rollback flag changes: a re-issued Desired would make an agent retry a
bundle it refused. A device whose deployments all went away gets its retained desired topic cleared.
Devices the control plane never published to are left alone (they may be managed with `edgefleet deploy`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import paho.mqtt.client as paho

from edgefleet.control.registry import memberships, resolve_desired
from edgefleet.control.store import Deployment, PublishedDesired, Store
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import Desired
from edgefleet.core.mqtt import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SyncReport:
    published: list[str]
    cleared: list[str]


def plan_desired(store: Store) -> dict[str, Deployment | None]:
    """device id → the deployment that applies to it now (None: none does)."""
    devices = store.devices()
    groups = store.groups()
    deployments = store.deployments()
    extra = {d.target for d in deployments if d.scope == "group"}
    member = memberships(groups, devices, extra)
    return {d.device_id: resolve_desired(d, deployments, groups, member[d.device_id]) for d in devices}


class DesiredPublisher:
    def __init__(self, conn: Connection, topics: Topics, store: Store) -> None:
        self.conn, self.topics, self.store = conn, topics, store

    def sync(self) -> SyncReport:
        """Publish what changed since the last sync; returns the devices published to and cleared."""
        plan = plan_desired(self.store)
        published = self.store.published()
        pending: list[tuple[str, PublishedDesired | None, paho.MQTTMessageInfo]] = []
        for device_id, want in sorted(plan.items()):
            have = published.get(device_id)
            if want is None:
                if have is not None:
                    info = self.conn.publish(self.topics.device_desired(device_id), b"", qos=1, retain=True)
                    pending.append((device_id, None, info))
                continue
            if have is not None and have.bundle_id == want.bundle_id and have.rollback == want.rollback:
                continue
            desired = Desired(
                bundle_id=want.bundle_id,
                model_name=want.model_name,
                model_version=want.model_version,
                profile=want.profile,
                rollback=want.rollback,
            )
            info = self.conn.publish(self.topics.device_desired(device_id), desired.encode(), qos=1, retain=True)
            pending.append(
                (device_id, PublishedDesired(device_id, want.bundle_id, want.rollback, desired.issued_at), info)
            )
        report = SyncReport([], [])
        deadline = time.monotonic() + ACK_TIMEOUT_S
        for device_id, record, info in pending:
            info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            if not info.is_published():
                raise BrokerError(f"the broker did not acknowledge the desired bundle of {device_id}")
            self.store.set_published(device_id, record)
            (report.published if record else report.cleared).append(device_id)
            if record:
                log.info("desired for %s: %s%s", device_id, record.bundle_id, " (rollback)" if record.rollback else "")
            else:
                log.info("desired for %s cleared", device_id)
        return report
