"""Read rights on benchmark candidates for the devices that measure them, on a broker whose rights edgefleet manages
(Mosquitto's dynamic-security plugin, edgefleet/control/rights/sync.py).

The candidates of one farm run get a role of their own, `edgefleet-farm-<run>`, holding read rights on their
offers and blocks; the role is given to the measuring devices' clients for the run and deleted after it. The
deployment rights (`DynsecRights.follow`) manage only each device's own role, so a sync of deployments running
meanwhile (another control-plane process) neither revokes these rights nor sees them. Mosquitto 2.0.11 kicks a
client whose roles change: a device reconnects once when the rights are given and once when they are taken back,
and the farm re-sends its request until the device answers.

On an unmanaged broker (embedded, anonymous, static ACL file) nothing is granted: the broker's own rules apply.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from edgefleet.control.rights.dynsec import granted_acls
from edgefleet.control.rights.sync import BrokerRights, DynsecError, DynsecRights
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

FARM_ROLE_PREFIX = "edgefleet-farm-"


@contextmanager
def candidate_rights(
    rights: BrokerRights, topics: Topics, devices: Sequence[str], bundle_ids: Sequence[str]
) -> Iterator[list[str]]:
    """Let `devices` read the candidate bundles while the block runs; yields the devices granted (every one on an
    unmanaged broker, which grants nothing itself). The role is deleted on the way out, whatever happened."""
    if not isinstance(rights, DynsecRights) or not devices:
        yield list(devices)
        return
    client = rights.client
    role = f"{FARM_ROLE_PREFIX}{uuid.uuid4().hex[:12]}"
    acls = sorted(granted_acls(topics, (), bundle_ids))
    client.check([{"command": "createRole", "rolename": role, "acls": [a.to_json() for a in acls]}])
    granted: list[str] = []
    try:
        replies = client.run([{"command": "addClientRole", "username": d, "rolename": role} for d in devices])
        for device, reply in zip(devices, replies, strict=True):
            if reply.get("error"):
                log.warning("device %s not granted the candidates (%s): it cannot measure them", device, reply["error"])
            else:
                granted.append(device)
        log.info("broker rights: %s may read %d candidate bundle(s) (role %s)", granted, len(bundle_ids), role)
        yield granted
    finally:
        _remove(rights, role, granted)


def _remove(rights: DynsecRights, role: str, granted: Sequence[str]) -> None:
    commands = [{"command": "removeClientRole", "username": d, "rolename": role} for d in granted]
    try:
        rights.client.check([*commands, {"command": "deleteRole", "rolename": role}])
    except DynsecError as err:
        # Left behind, it lets these devices read benchmark-only bundles, which they never serve: say so loudly.
        log.error("broker rights: role %s not removed (%s): delete it with the dynsec tool", role, err)
        return
    log.info("broker rights: candidate role %s removed from %s", role, list(granted))
