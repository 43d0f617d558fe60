"""Mosquitto's dynamic security plugin, as edgefleet uses it: roles, ACLs and the initial configuration file.

Identity: the broker's TLS listener has `use_identity_as_username true` and `use_username_as_clientid true`, so a
client's user name *and* client id are its certificate's CN. With a certificate identity Mosquitto 2.0.11 skips
the plugin's password check altogether (src/handle_connect.c): the CA is the authenticator, and the plugin only
answers ACL checks for the user name. A CN the plugin does not know gets nothing (every check defers, which
Mosquitto treats as a denial).

Roles (all topics from `edgefleet.core.topics.Topics`):
- `edgefleet-host`, held by every control-plane identity: everything under the prefix (publish, subscribe,
  receive, shared subscriptions too) and the plugin's own `$CONTROL/dynamic-security/v1` topics, so the
  control plane can grant and revoke;
- `edgefleet-device-ID`, one per device, held only by the client ID: its *base* rights (write its own status,
  telemetry, events and inference answers; read its own desired topics, one per slot (`desired/+`), and inference
  requests) plus the rights the control plane grants and revokes as deployments change: the `desired/+` topics of
  each group the host
  registry puts it in, the offer and blocks of each bundle it is asked to install, and (with any bundle) chunks
  by name (`chunk_acls`).

Default access is deny for everything but unsubscribing: a right exists only where a role grants it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import DEFAULT_PREFIX, HOST_IDENTITY, Topics, check_segment

CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = f"{CONTROL_TOPIC}/response"
HOST_ROLE = "edgefleet-host"
DEVICE_ROLE_PREFIX = "edgefleet-device-"

AclType = Literal["publishClientSend", "publishClientReceive", "subscribeLiteral", "subscribePattern"]


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL entry of a role, as the plugin stores it."""

    acltype: AclType
    topic: str
    allow: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"acltype": self.acltype, "topic": self.topic, "priority": 0, "allow": self.allow}


def device_role(device_id: str) -> str:
    return DEVICE_ROLE_PREFIX + check_segment("device id", device_id)


def _read(topic: str, *, pattern: bool = False) -> list[Acl]:
    """Subscribe to and receive `topic` (a literal topic, or a pattern with `+`)."""
    return [Acl("subscribePattern" if pattern else "subscribeLiteral", topic), Acl("publishClientReceive", topic)]


def base_acls(topics: Topics, device_id: str) -> list[Acl]:
    """What every device may do, whatever it is deployed."""
    write = [
        topics.status(device_id),
        topics.telemetry(device_id),
        topics.events(device_id),
        topics.infer_responses(device_id),
        topics.generate_responses(device_id),
        topics.benchmark_results(device_id),
    ]
    acls = [Acl("publishClientSend", topic) for topic in write]
    acls += _read(topics.device_desired_slots(device_id), pattern=True)  # every slot's document
    acls += _read(topics.infer_request(device_id))
    acls += _read(topics.infer_feedback(device_id))  # field-accuracy feedback on MQTT request/response
    acls += _read(topics.generate_request(device_id))  # a language model's requests; answers stream as chunks
    acls += _read(topics.agent_release_offers(), pattern=True)  # agent releases: signed, public (core/release/)
    acls += _read(topics.benchmark_request(device_id))  # the fleet as the benchmark farm
    acls += _read(topics.stored(device_id))  # what the control plane stored of its reports (its spool prunes to it)
    return acls


def chunk_acls(topics: Topics) -> list[Acl]:
    """Content-addressed chunks (core/transfer/chunks.py) are shared by bundles, so they are read by name: a device may
    subscribe to any one chunk topic, never to the wildcard (a literal ACL is checked before the role's patterns).
    A chunk's name is the sha256 of its bytes and only signed offers list it, so a device can fetch a chunk of a
    bundle only if it may read that bundle's offer or already holds the bytes. Granted with any bundle."""
    wildcard = topics.all_chunks()
    deny = [Acl("subscribeLiteral", wildcard, allow=False), Acl("subscribeLiteral", wildcard[:-1] + "#", allow=False)]
    return deny + _read(wildcard, pattern=True)


def group_acls(topics: Topics, group: str) -> list[Acl]:
    return _read(topics.group_desired_slots(group), pattern=True)


def bundle_acls(topics: Topics, bundle_id: str) -> list[Acl]:
    return (
        _read(topics.bundle_offer(bundle_id))
        + _read(topics.bundle_blocks(bundle_id), pattern=True)
        + chunk_acls(topics)
    )


def own_desired_acls(topics: Topics, device_id: str) -> set[Acl]:
    """A device's read of its own desired documents, every slot (`devices/{id}/desired/+`). A base right, which the
    control plane also keeps as it should be: a role made before slots held the single-model literal topic
    (`devices/{id}/desired`), which the next rights sync replaces with this one."""
    return set(_read(topics.device_desired_slots(device_id), pattern=True))


def _own_desired(topics: Topics, topic: str) -> bool:
    """Whether `topic` is a device's own desired topic as a role may hold it (per slot, or the legacy literal)."""
    head = f"{topics.prefix}/devices/"
    return topic.startswith(head) and (topic.endswith("/desired/+") or topic.endswith("/desired"))


def granted_acls(
    topics: Topics, groups: Iterable[str], bundles: Iterable[str], device_id: str | None = None
) -> set[Acl]:
    """The rights that follow deployments: group desired topics and bundle topics (and, given `device_id`, the
    device's own desired topics, kept current: `own_desired_acls`)."""
    acls: set[Acl] = own_desired_acls(topics, device_id) if device_id is not None else set()
    for group in groups:
        acls.update(group_acls(topics, group))
    for bundle_id in bundles:
        acls.update(bundle_acls(topics, bundle_id))
    return acls


def is_granted(topics: Topics, acl: Acl) -> bool:
    """Whether `acl` is one the control plane manages (a group's desired, a bundle's, chunks, the device's own
    desired topics), not a base right."""
    managed = (f"{topics.prefix}/bundles/", f"{topics.prefix}/groups/", f"{topics.prefix}/chunks/")
    return acl.topic.startswith(managed) or _own_desired(topics, acl.topic)


def host_acls(topics: Topics) -> list[Acl]:
    everything = f"{topics.prefix}/#"
    return [
        Acl("publishClientSend", everything),
        Acl("publishClientReceive", everything),
        Acl("subscribePattern", everything),
        Acl("subscribePattern", f"$share/+/{everything}"),  # the ingestor's shared subscriptions
        Acl("publishClientSend", CONTROL_TOPIC),
        *_read(RESPONSE_TOPIC),
    ]


def render_config(
    devices: Mapping[str, Sequence[str]],
    assignments: Mapping[str, Sequence[str]] | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    host_users: Sequence[str] = (HOST_IDENTITY,),
) -> str:
    """The plugin's JSON configuration (`plugin_opt_config_file`) for a first start: the host role and users,
    and one role per device with its base rights, its groups' desired topics and any `assignments`.

    After the first start the broker owns the file (it rewrites it on every change); the control plane then
    grants and revokes over `$CONTROL/dynamic-security/v1`.
    """
    topics = Topics(prefix)
    hosts = list(dict.fromkeys(_segment("host user", h) for h in host_users))
    clash = sorted(set(hosts) & set(devices))
    if clash:
        raise UserInputError(f"{', '.join(clash)} cannot be both a host user and a device")
    unknown = sorted(set(assignments or {}) - set(devices))
    if unknown:
        raise UserInputError(f"bundles assigned to unknown devices: {', '.join(unknown)}; list them as devices too")
    roles = [{"rolename": HOST_ROLE, "acls": [a.to_json() for a in host_acls(topics)]}]
    clients = [
        {"username": h, "textname": "edgefleet control plane", "roles": [{"rolename": HOST_ROLE}]} for h in hosts
    ]
    for device_id in sorted(devices):
        _segment("device id", device_id)
        groups = [_segment("group", g) for g in devices[device_id]]
        bundles = [_segment("bundle id", b) for b in (assignments or {}).get(device_id, ())]
        acls = sorted(set(base_acls(topics, device_id)) | granted_acls(topics, groups, bundles))
        roles.append({"rolename": device_role(device_id), "acls": [a.to_json() for a in acls]})
        clients.append(
            {"username": device_id, "textname": "edgefleet device", "roles": [{"rolename": device_role(device_id)}]}
        )
    config = {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": False,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": clients,
        "groups": [],
        "roles": roles,
    }
    return json.dumps(config, indent=2) + "\n"


def _segment(kind: str, value: str) -> str:
    try:
        return check_segment(kind, value)
    except ValueError as err:
        raise UserInputError(str(err)) from err


__all__ = [
    "CONTROL_TOPIC",
    "HOST_ROLE",
    "RESPONSE_TOPIC",
    "Acl",
    "base_acls",
    "bundle_acls",
    "chunk_acls",
    "device_role",
    "granted_acls",
    "group_acls",
    "host_acls",
    "is_granted",
    "own_desired_acls",
    "render_config",
]
