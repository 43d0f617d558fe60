"""The one source of truth for bundle rights: the retained signed desired documents devices obey.

A device runs what a signed desired document on the broker tells it (its own topic first, then its groups'), so
the bundles it must be able to read are exactly the ones those documents name: the bundle to run, the shadow and
the allowed downgrade (`allow_downgrade_to`, a signed rollback). Both paths that grant bundle rights derive them
from here, so neither takes back what the other's documents still name:
- the control plane's sync (`DesiredPublisher.sync` -> `device_grants`): what its plan wants now (granted before
  it is published) plus what the retained documents name, read by a `DesiredWatch` that stays subscribed;
- `edgefleet deploy` (`broker_rights_deploy.grant_deploy`): the bundle it deploys plus what the retained
  documents it does not replace name, read once (`read_documents`).

A document counts only as a device would count it: signed by an ops key of a key set the host's pinned root
signed (`root.pub` in the key directory), bound to the topic it sits on (`device:ID`, `group:NAME`), and not
older (counter) than the document already known for that topic. Each slot of a target has its own document
(`.../desired/{slot}`), so a device must be able to read what every slot's document names. A payload a device
would refuse (unsigned, forged, replayed, an empty message) leaves the known document in force, as the device keeps
it in force. A signed clear, or a slot removal, names nothing. Expiry does not matter here: a device keeps
running what a stale document named.

Rollback: a device's local rollback loads a bundle it holds on disk (re-verified, `load_installed`) and fetches
nothing. A fleet rollback is a signed document naming the older bundle (`allow_downgrade_to`), so its rights are
granted before the document is published, and kept while any retained document names it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.control.broker.retained import read_retained
from edgefleet.core.errors import BrokerError, SignatureError, UserInputError
from edgefleet.core.messages import Desired, MessageError, SignedDesired, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics
from edgefleet.core.trust.keyset import verify_keyset, verify_payload
from edgefleet.core.trust.signing import TrustedKeys

log = logging.getLogger(__name__)

NAMED_FIELDS = ("bundle_id", "shadow_bundle_id", "allow_downgrade_to")
READ_TIMEOUT_S = 15.0
SEEN_MAX = 50_000  # verdicts kept (a digest each), so a re-delivered document costs no signature check


@dataclass(frozen=True)
class Named:
    """One verified document: its counter and the bundles it names."""

    counter: int
    bundles: frozenset[str]


@dataclass(frozen=True)
class DesiredDocuments:
    """The retained documents in force: (device id, slot) -> its own document, (group, slot) -> the group's."""

    devices: Mapping[tuple[str, str], Named] = field(default_factory=dict)
    groups: Mapping[tuple[str, str], Named] = field(default_factory=dict)

    def named_for(
        self, device_id: str, groups: Iterable[str], *, skip_own: bool = False, skip_groups: Iterable[str] = (),
        slot: str = DEFAULT_SLOT,
    ) -> frozenset[str]:  # fmt: skip
        """Every bundle a document this device obeys names, in every slot: its own and its `groups'` (except, in
        `slot`, those skipped: the ones a deploy to that slot is about to replace)."""
        named: set[str] = set()
        member, skipped = set(groups), set(skip_groups)
        for (target, its_slot), own in self.devices.items():
            if target == device_id and not (skip_own and its_slot == slot):
                named |= own.bundles
        for (group, its_slot), document in self.groups.items():
            if group in member and not (group in skipped and its_slot == slot):
                named |= document.bundles
        return frozenset(named)


def load_root(path: Path) -> TrustedKeys | None:
    """The root key the host pins (`keys init` writes root.pub); None (logged) when there is none to read."""
    try:
        return TrustedKeys.load([path])
    except UserInputError as err:
        log.warning("cannot read the root key %s (%s): retained desired documents grant no bundle rights", path, err)
        return None


def _target(topics: Topics, topic: str) -> tuple[str, str, str] | None:
    """('device' | 'group', name, slot) of a per-slot desired topic, None for any other topic (a legacy one too:
    devices no longer read it)."""
    parts = topic.split("/")
    prefix = topics.prefix.split("/")
    if len(parts) != len(prefix) + 4 or parts[: len(prefix)] != prefix or parts[-2] != "desired":
        return None
    kind, name, slot = parts[len(prefix)], parts[len(prefix) + 1], topics.desired_slot_of(topic)
    if slot is None:
        return None
    if kind == "devices":
        return "device", name, slot
    if kind == "groups":
        return "group", name, slot
    return None


def verified_named(topics: Topics, topic: str, payload: bytes, root: TrustedKeys) -> Named | None:
    """The bundles a retained document names, if a device would accept it on `topic` (see the module
    docstring); None when it would refuse it."""
    target = _target(topics, topic)
    if target is None or not payload:
        return None
    try:
        signed = decode(SignedDesired, payload)
        if signed.keyset is None:  # edgefleet always attaches it; without it this host cannot tell who signed
            return None
        keyset = verify_keyset(signed.keyset, root)
        desired = Desired.model_validate_json(verify_payload("desired", signed.desired, keyset.trusted("ops")))
    except (MessageError, SignatureError, ValueError) as err:
        log.debug("retained document on %s does not count for rights: %s", topic, err)
        return None
    if desired.target != f"{target[0]}:{target[1]}" or desired.slot != target[2]:
        return None
    if desired.clear or desired.remove:
        return Named(desired.counter, frozenset())
    return Named(desired.counter, frozenset(b for b in (getattr(desired, f) for f in NAMED_FIELDS) if b))


class DocumentsInForce:
    """Topic -> the document in force, with a device's rules: a refused payload or an older counter changes
    nothing. Thread-safe."""

    def __init__(self, topics: Topics, root: TrustedKeys | None) -> None:
        self.topics, self.root = topics, root
        self._lock = threading.Lock()
        self._named: dict[str, Named] = {}
        self._seen: dict[
            tuple[str, bytes], Named | None
        ] = {}  # (topic, sha256) -> verdict: re-delivered, not re-verified

    def consider(self, topic: str, payload: bytes) -> None:
        if self.root is None or not payload:
            return
        key = (topic, hashlib.sha256(payload).digest())
        if key in self._seen:
            named = self._seen[key]
        else:
            named = verified_named(self.topics, topic, payload, self.root)
            if len(self._seen) >= SEEN_MAX:
                self._seen.clear()
            self._seen[key] = named
        if named is None:
            return
        with self._lock:
            known = self._named.get(topic)
            if known is None or named.counter >= known.counter:
                self._named[topic] = named

    def snapshot(self) -> DesiredDocuments:
        devices: dict[tuple[str, str], Named] = {}
        groups: dict[tuple[str, str], Named] = {}
        with self._lock:
            items = list(self._named.items())
        for topic, named in items:
            target = _target(self.topics, topic)
            if target is not None:
                (devices if target[0] == "device" else groups)[(target[1], target[2])] = named
        return DesiredDocuments(devices, groups)


def _filters(topics: Topics) -> list[str]:
    return [f"{topics.prefix}/devices/+/desired/+", f"{topics.prefix}/groups/+/desired/+"]


def read_documents(
    conn: Connection, topics: Topics, root: TrustedKeys | None, timeout: float = READ_TIMEOUT_S
) -> DesiredDocuments:
    """Every retained desired document in force, read once (the CLI's deploy). BrokerError when the broker did not
    deliver them all within `timeout`: granting from half a picture could take back what a device needs."""
    if root is None:
        return DesiredDocuments()
    found, complete = read_retained(conn, topics.prefix, _filters(topics), timeout)
    if not complete:
        raise BrokerError(f"could not read the retained desired state within {timeout:g} s")
    documents = DocumentsInForce(topics, root)
    for topic, payload in found.items():
        documents.consider(topic, payload)
    return documents.snapshot()


class DesiredWatch:
    """The control plane's standing view of the retained documents: subscribed once (a reconnect re-delivers
    them), updated as documents are published. `documents()` first waits for a marker it publishes to itself,
    so every document the broker accepted before the call is in the answer."""

    def __init__(self, conn: Connection, topics: Topics, root: TrustedKeys | None) -> None:
        self.conn, self.topics = conn, topics
        self._documents = DocumentsInForce(topics, root)
        self._marker = f"{topics.prefix}/reader/rights-{uuid.uuid4().hex}"
        self._cond = threading.Condition()
        self._echoed = self._asked = 0
        conn.subscribe(self._marker, self._on_marker)
        conn.subscribe_many(_filters(topics), lambda topic, payload, _r: self._documents.consider(topic, payload))

    def _on_marker(self, _topic: str, payload: bytes, _retained: bool) -> None:
        with self._cond:
            self._echoed = max(self._echoed, int(payload or b"0"))
            self._cond.notify_all()

    def documents(self, timeout: float = READ_TIMEOUT_S) -> DesiredDocuments:
        """The documents in force now. BrokerError when the marker does not come back within `timeout`."""
        with self._cond:
            self._asked += 1
            asked = self._asked
        self.conn.publish(self._marker, str(asked).encode(), qos=1)
        with self._cond:
            if not self._cond.wait_for(lambda: self._echoed >= asked, timeout):
                raise BrokerError(f"the broker did not echo the rights marker within {timeout:g} s")
        return self._documents.snapshot()

    def stop(self) -> None:
        self.conn.unsubscribe_many([self._marker, *_filters(self.topics)])


__all__ = [
    "DesiredDocuments",
    "DesiredWatch",
    "DocumentsInForce",
    "Named",
    "load_root",
    "read_documents",
    "verified_named",
]
