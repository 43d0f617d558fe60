"""Broker rights that follow deployments: what each device may read changes with what it is asked to run.

One small interface, `BrokerRights.follow(grants)`: given every device's `DeviceGrant` (the groups the host
registry puts it in, the bundles it must be able to download), make the broker grant what is missing and revoke
what is no longer needed, and return only once the broker confirmed it. `DesiredPublisher.sync` calls it before
it publishes any desired state, so a device never learns of a bundle it may not read.

Implementations:
- `DynsecRights`: Mosquitto's dynamic security plugin, managed over `$CONTROL/dynamic-security/v1` by the control
  plane's own certificate identity (role `edgefleet-host`, see `edgefleet.control.rights.dynsec`). Each change is
  answered by the broker, so "granted before published" holds by construction.
- `NoBrokerRights`: the embedded amqtt broker, an anonymous broker, or one without the plugin (a static ACL
  file): nothing is granted or revoked, and it says so once in the log and in `describe()`.

`open_rights(conn, topics, mode)` picks one: `dynsec`, `none`, or `auto` (dynsec when the connection uses a TLS
client certificate and the broker answers the plugin's `getDefaultACLAccess`, else none).

Mosquitto 2.0.11 disconnects ("kicks") every client holding a role whose ACLs change (roles.c,
`role__kick_all`), without its last will. A device whose rights change therefore reconnects once (paho backs
off 1 s first) and re-subscribes; its retained desired state is still there. The changes for one sync go out
as one message, so a device is kicked at most once per sync.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from edgefleet.control.fleet.registry import enrolled, memberships, revoked
from edgefleet.control.rights.documents import DesiredDocuments
from edgefleet.control.rights.dynsec import (
    CONTROL_TOPIC,
    RESPONSE_TOPIC,
    Acl,
    base_acls,
    device_role,
    granted_acls,
    is_granted,
)
from edgefleet.control.rights.external_grants import ForeignGrace, held_bundles
from edgefleet.control.store import Deployment, Store
from edgefleet.core.errors import BrokerError, UserInputError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

RightsMode = Literal["auto", "dynsec", "none"]
RIGHTS_MODES: tuple[RightsMode, ...] = ("auto", "dynsec", "none")
REPLY_TIMEOUT_S = 15.0
REREAD_S = 60.0  # re-read the roles this often: another control-plane process (a failover) may have changed them
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DeviceGrant:
    """What one device must be able to read beyond its base rights."""

    device_id: str
    groups: frozenset[str] = frozenset()
    bundles: frozenset[str] = frozenset()


@dataclass
class RightsChange:
    """What one `follow` did: devices granted or revoked something, devices the broker does not know."""

    granted: dict[str, int] = field(default_factory=dict)  # device -> ACL entries added
    revoked: dict[str, int] = field(default_factory=dict)  # device -> ACL entries removed
    unknown: list[str] = field(default_factory=list)  # devices without a role on the broker (not enrolled)


class BrokerRights(Protocol):
    managed: bool  # False: a no-op (callers may skip computing grants)

    def follow(self, grants: Mapping[str, DeviceGrant]) -> RightsChange:
        """Grant what is missing and revoke what is no longer needed; return once the broker confirmed it."""
        ...

    def describe(self) -> str: ...


class NoBrokerRights:
    """A broker whose rights edgefleet does not manage: every grant is a no-op, and it says so once."""

    managed = False

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self._said = False

    def follow(self, grants: Mapping[str, DeviceGrant]) -> RightsChange:
        if not self._said and grants:
            log.info("broker rights are not managed (%s): granting nothing to %d device(s)", self.reason, len(grants))
            self._said = True
        return RightsChange()

    def describe(self) -> str:
        return f"not managed: {self.reason}"


class DynsecError(BrokerError):
    """The dynamic security plugin refused a command, or did not answer."""


class DynsecClient:
    """Commands to the plugin over MQTT, each answered on the response topic (matched by correlation data)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._cond = threading.Condition()
        self._replies: dict[str, dict[str, Any]] = {}
        conn.subscribe(RESPONSE_TOPIC, self._on_response)

    def _on_response(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            doc = json.loads(payload)
            responses = doc.get("responses", []) if isinstance(doc, dict) else []
        except (ValueError, AttributeError):
            return
        with self._cond:
            for response in responses:
                if isinstance(response, dict) and isinstance(response.get("correlationData"), str):
                    self._replies[response["correlationData"]] = response
            self._cond.notify_all()

    def run(self, commands: list[dict[str, Any]], timeout: float = REPLY_TIMEOUT_S) -> list[dict[str, Any]]:
        """Send `commands` in one message; their responses, in order. A refused command is a DynsecError."""
        if not commands:
            return []
        tags = [uuid.uuid4().hex for _ in commands]
        payload = {"commands": [{**c, "correlationData": t} for c, t in zip(commands, tags, strict=True)]}
        self.conn.publish(CONTROL_TOPIC, json.dumps(payload).encode(), qos=1, wait=timeout)
        with self._cond:
            if not self._cond.wait_for(lambda: all(t in self._replies for t in tags), timeout):
                raise DynsecError(
                    f"the broker's dynamic-security plugin did not answer {commands[0]['command']} within {timeout:g} s"
                )
            replies = [self._replies.pop(t) for t in tags]
        return replies

    def check(self, commands: list[dict[str, Any]], timeout: float = REPLY_TIMEOUT_S) -> list[dict[str, Any]]:
        replies = self.run(commands, timeout)
        for command, reply in zip(commands, replies, strict=True):
            if reply.get("error"):
                raise DynsecError(f"dynamic-security {command['command']} failed: {reply['error']}")
        return replies


class DynsecRights:
    """Rights kept in Mosquitto's dynamic security plugin: one role per device (`edgefleet-device-ID`)."""

    managed = True

    def __init__(self, conn: Connection, topics: Topics, client: DynsecClient | None = None) -> None:
        self.topics = topics
        self.client = client or DynsecClient(conn)
        self._known: dict[str, frozenset[Acl]] = {}  # device -> the managed ACLs its role holds now
        self.grace = ForeignGrace()
        self._followed: dict[str, DeviceGrant] = {}  # device -> its grant at the last `follow`
        self._read_at = 0.0

    def describe(self) -> str:
        return "Mosquitto dynamic-security plugin"

    def follow(self, grants: Mapping[str, DeviceGrant]) -> RightsChange:
        def want_of(device_id: str, have: frozenset[Acl]) -> frozenset[Acl]:
            grant = grants[device_id]  # + what someone else granted just before its document (grace, see there)
            bundles = grant.bundles | self.grace.kept(device_id, held_bundles(self.topics, have), grant.bundles)
            return frozenset(granted_acls(self.topics, sorted(grant.groups), sorted(bundles), device_id))

        for device_id, grant in grants.items():  # a changed grant (a new document): re-read what the role holds,
            if self._followed.get(device_id) != grant:  # since whoever published it may have changed it too
                self._known.pop(device_id, None)
        self._followed = dict(grants)
        return self.apply(want_of, sorted(grants))

    def apply(self, want_of: Callable[[str, frozenset[Acl]], frozenset[Acl]], devices: Iterable[str]) -> RightsChange:
        """THE one rights path: for each of `devices` the broker knows, `want_of(device, the managed ACLs it holds
        now)` becomes its managed ACLs; the changes go out as one message, and this returns once the broker
        confirmed them. `follow` (the control plane) and `edgefleet deploy` (broker_rights_deploy.py) use it."""
        change = RightsChange()
        if time.monotonic() - self._read_at > REREAD_S:
            self._known.clear()
            self._read_at = time.monotonic()
        wanted_devices = sorted(set(devices))
        self._load([d for d in wanted_devices if d not in self._known], change)
        wanted = {d: want_of(d, self._known[d]) for d in wanted_devices if d in self._known}
        commands: list[dict[str, Any]] = []
        touched: list[tuple[str, frozenset[Acl]]] = []
        for device_id in sorted(wanted):
            if device_id not in self._known:
                continue  # no role on the broker: reported in change.unknown
            have, want = self._known[device_id], wanted[device_id]
            if have == want:
                continue
            role = device_role(device_id)
            add, remove = sorted(want - have), sorted(have - want)
            commands += [{"command": "addRoleACL", "rolename": role, **a.to_json()} for a in add]
            commands += [
                {"command": "removeRoleACL", "rolename": role, "acltype": a.acltype, "topic": a.topic} for a in remove
            ]
            touched.append((device_id, want))
            if add:
                change.granted[device_id] = len(add)
            if remove:
                change.revoked[device_id] = len(remove)
        if commands:
            replies = self.client.run(commands)
            # Another process (a CLI deploy) may have made the same change first: the result holds all the same.
            refused = [(c, r) for c, r in zip(commands, replies, strict=True) if r.get("error") and not _done(r)]
            if refused:
                for device_id, _ in touched:  # re-read what really holds next time
                    self._known.pop(device_id, None)
                command, reply = refused[0]
                raise DynsecError(f"dynamic-security {command['command']} failed: {reply['error']}")
            for device_id, want in touched:
                self._known[device_id] = want
            log.info("broker rights: granted %s, revoked %s", change.granted or "-", change.revoked or "-")
        return change

    def _load(self, devices: list[str], change: RightsChange) -> None:
        """Read the managed ACLs of these devices' roles from the broker (one message)."""
        if not devices:
            return
        replies = self.client.run([{"command": "getRole", "rolename": device_role(d)} for d in devices])
        for device_id, reply in zip(devices, replies, strict=True):
            if reply.get("error"):
                change.unknown.append(device_id)
                log.warning(
                    "device %s has no role on the broker (%s): enrol it with `edgefleet keys enroll`",
                    device_id,
                    reply["error"],
                )
                continue
            acls = (reply.get("data") or {}).get("role", {}).get("acls", [])
            self._known[device_id] = frozenset(
                acl
                for acl in (_acl(entry) for entry in acls if isinstance(entry, dict))
                if acl is not None and is_granted(self.topics, acl)
            )

    def enroll(self, device_id: str, groups: Iterable[str] = ()) -> None:
        """Create the device's role (base rights + its groups' desired) and its client, on a running broker."""
        role = device_role(device_id)
        acls = sorted(set(base_acls(self.topics, device_id)) | granted_acls(self.topics, sorted(groups), ()))
        self.client.check(
            [
                {"command": "createRole", "rolename": role, "acls": [a.to_json() for a in acls]},
                {"command": "createClient", "username": device_id, "roles": [{"rolename": role}]},
            ]
        )
        self._known.pop(device_id, None)


def device_grants(
    store: Store, plan: Mapping[tuple[str, str], Deployment | None], named: DesiredDocuments | None = None
) -> dict[str, DeviceGrant]:
    """Each known device's grant: the groups the host registry puts it in, and the bundles of its resolved
    deployment of every slot (`plan`, (device, slot) -> deployment, from `desired.plan_desired`, with the shadow
    each names) plus every bundle a retained signed
    desired document it obeys names (`named`, broker_rights_named.py: what `edgefleet deploy` published, or an
    earlier plan still in force). A device the registry has not enrolled (`devices enroll`) gets no group and no
    plan: what it says about itself (profile, `--group`) never opens a topic on the broker; only a document signed
    for its own id does. A revoked device (`keys revoke-device`) is left out: it has no role to grant to."""
    devices = [d if enrolled(d) else replace(d, groups=()) for d in store.devices() if not revoked(d)]
    member = memberships(store.groups(), devices)
    grants = {}
    wanted: dict[str, set[str]] = {}
    for (device_id, _slot), want in plan.items():
        if want is not None:
            wanted.setdefault(device_id, set()).update(b for b in (want.bundle_id, want.shadow_bundle_id) if b)
    for device in devices:
        groups = frozenset(member.get(device.device_id, ()))
        bundles = set(wanted.get(device.device_id, ())) if enrolled(device) else set()
        if named is not None:
            bundles |= named.named_for(device.device_id, groups)
        grants[device.device_id] = DeviceGrant(device.device_id, groups=groups, bundles=frozenset(bundles))
    return grants


def _done(reply: dict[str, Any]) -> bool:
    """An error that means the broker already holds what the command asked for."""
    error = str(reply.get("error", ""))
    return error in ("ACL with this topic already exists", "ACL not found")


def _acl(entry: dict[str, Any]) -> Acl | None:
    kind, topic = entry.get("acltype"), entry.get("topic")
    if kind not in ("publishClientSend", "publishClientReceive", "subscribeLiteral", "subscribePattern"):
        return None
    if not isinstance(topic, str):
        return None
    return Acl(kind, topic, bool(entry.get("allow", True)))


def probe_dynsec(client: DynsecClient, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the broker's dynamic-security plugin answers this identity."""
    try:
        replies = client.run([{"command": "getDefaultACLAccess"}], timeout)
    except BrokerError:
        return False
    return not replies[0].get("error")


def open_rights(conn: Connection, topics: Topics, mode: RightsMode = "auto") -> BrokerRights:
    """The rights manager for this connection (see the module docstring for `mode`)."""
    if mode == "none":
        log.info("broker rights are not managed (--broker-rights none)")
        return NoBrokerRights("--broker-rights none")
    if mode not in RIGHTS_MODES:
        raise UserInputError(f"unknown broker rights mode {mode!r}; choose from {', '.join(RIGHTS_MODES)}")
    tls = conn.tls
    if mode == "auto" and not (conn.address.tls and tls is not None and tls.cert):
        log.info("broker rights are not managed: no TLS client certificate (an open or embedded broker)")
        return NoBrokerRights("no TLS client certificate: an open or embedded broker has no per-device rights")
    client = DynsecClient(conn)
    if probe_dynsec(client):
        log.info("broker rights follow deployments (Mosquitto dynamic-security plugin)")
        return DynsecRights(conn, topics, client)
    if mode == "dynsec":
        raise DynsecError(
            f"the broker did not answer on {CONTROL_TOPIC}: is mosquitto_dynamic_security.so loaded, and does this "
            "certificate's CN hold the edgefleet-host role?"
        )
    log.warning("the broker has no dynamic-security plugin for this identity: broker rights are not managed")
    return NoBrokerRights("the broker did not answer the dynamic-security plugin's getDefaultACLAccess")


__all__ = [
    "RIGHTS_MODES",
    "BrokerRights",
    "DeviceGrant",
    "DynsecClient",
    "DynsecError",
    "DynsecRights",
    "NoBrokerRights",
    "RightsChange",
    "RightsMode",
    "device_grants",
    "open_rights",
    "probe_dynsec",
]
