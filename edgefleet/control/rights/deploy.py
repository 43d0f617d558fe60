"""Rights for `edgefleet deploy`: the devices it names may read the bundle before they are told to run it.

Bundle rights follow the retained signed desired documents (broker_rights_named.py), here as in the control
plane's sync, so the two agree. A deploy asks the broker, through the same path (`DynsecRights.apply`), and gives
each device it touches exactly: the bundle it deploys, plus every bundle named by the retained documents the
device obeys that this deploy does not replace (its own document unless `--device` names it; its groups'
documents, but for the `--group`s deployed). Its groups are the broker's view (the group desired topics its role
may read: `keys dynsec --device ID:G`, `keys enroll --group G`, or the control plane's registry):
- `--device D`: D;
- `--group G`: every device whose role may read G's desired topic.
It runs before the desired documents are published and returns once the broker confirmed the grant. On a broker
whose rights edgefleet does not manage (embedded, anonymous, static ACL) it grants nothing and says why.

A control plane running beside it keeps these rights: its sync grants what the retained documents name, and
keeps a right it did not grant itself for a minute while no document names it yet (broker_rights_grace.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.rights.documents import load_root, read_documents
from edgefleet.control.rights.dynsec import DEVICE_ROLE_PREFIX, Acl, granted_acls, is_granted
from edgefleet.control.rights.sync import DynsecRights, RightsMode, open_rights
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

log = logging.getLogger(__name__)


@dataclass
class DeployGrant:
    """What a deploy granted: `managed` False means the broker's rights are not edgefleet's (see `reason`)."""

    managed: bool
    reason: str
    devices: list[str] = field(default_factory=list)  # devices that may now read the bundle
    unknown: list[str] = field(default_factory=list)  # named devices the broker has no role for


def group_members(rights: DynsecRights, groups: Iterable[str]) -> set[str]:
    """Devices whose role may read one of these groups' desired topics (the broker's own view of membership)."""
    wanted = {rights.topics.group_desired_slots(g) for g in groups}
    if not wanted:
        return set()
    (reply,) = rights.client.check([{"command": "listRoles", "verbose": True, "count": -1, "offset": 0}])
    members = set()
    for role in (reply.get("data") or {}).get("roles", []):
        name = role.get("rolename", "") if isinstance(role, dict) else ""
        if not name.startswith(DEVICE_ROLE_PREFIX):
            continue
        topics = {a.get("topic") for a in role.get("acls", []) if isinstance(a, dict)}
        if topics & wanted:
            members.add(name[len(DEVICE_ROLE_PREFIX) :])
    return members


def grant_deploy(
    conn: Connection,
    topics: Topics,
    bundle_id: str,
    *,
    devices: Iterable[str] = (),
    groups: Iterable[str] = (),
    mode: RightsMode = "auto",
    keys: HostKeys | None = None,
    slot: str = DEFAULT_SLOT,
) -> DeployGrant:
    """Let the named devices and the groups' members read `bundle_id` (see the module docstring)."""
    rights = open_rights(conn, topics, mode)
    if not isinstance(rights, DynsecRights):
        return DeployGrant(False, rights.describe())
    named, deployed_groups = set(devices), set(groups)
    members = group_members(rights, deployed_groups) - named
    documents = read_documents(conn, topics, load_root((keys or HostKeys.default()).root_public()))
    group_prefix = f"{topics.prefix}/groups/"

    def want(device_id: str, have: frozenset[Acl]) -> frozenset[Acl]:
        its_groups = sorted(
            {a.topic[len(group_prefix) :].split("/")[0] for a in have if a.topic.startswith(group_prefix)}
        )
        bundles = documents.named_for(
            device_id, its_groups, skip_own=device_id in named, skip_groups=deployed_groups, slot=slot
        )
        base = frozenset(a for a in have if not is_granted(topics, a))
        return base | granted_acls(topics, its_groups, sorted(bundles | {bundle_id}), device_id)

    change = rights.apply(want, named | members)
    granted = sorted((named | members) - set(change.unknown))
    log.info("deploy: %s may read %s (%d granted)", ", ".join(granted) or "no device", bundle_id, len(change.granted))
    return DeployGrant(True, rights.describe(), granted, sorted(change.unknown))


__all__ = ["DeployGrant", "grant_deploy", "group_members"]
