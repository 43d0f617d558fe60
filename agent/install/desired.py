"""Signed desired state on the device (Uptane-director style), one document per (target, slot).

A device runs several models, each in a named slot (edgefleet/core/topics.py); each slot has its own documents on
`devices/{id}/desired/{slot}` and `groups/{g}/desired/{slot}`. A desired document is accepted only when:
- it is a `SignedDesired` whose `Desired` an operations key (delegated by the pinned root's key set) signed;
- its `target` is this topic's: `device:<this id>` on the device topic, `group:<g>` on group g's topic;
- its `slot` is this topic's slot (a document signed for one slot is never acted on for another);
- its counter is not below the highest this device accepted for that (target, slot) (a document with the same
  counter is accepted only if it is byte-identical: the broker redelivering a retained message);
- it has not expired (an expired document is never acted on).
The highest counters persist (STATE_DIR/trust/counters.json, keyed `target@slot`), so a replay fails after a restart
too. Resolution is per slot: the device's own document beats its highest-priority group's. When a slot's document in
force expires and no newer one arrives, `stale(slot)` says so; the device keeps running what it has. A document whose
`remove` is set is in force like any other: the slot is drained, unloaded and its files forgotten
(agent/install/worker.py).

Migration: a state dir written by a single-model agent kept `trust/desired/device.json` and counters keyed by target
alone; those are slot "default"'s (agent/install/migration.py moves the files; counters without a slot read as
"default"'s here).

Clearing: an empty message on a desired topic (a cleared retained message) is not signed, so it is refused: the
document in force stays, and with it the bundle and the floor. The host clears with a signed document whose
`clear` is set; then the device forgets that target's document (its group's applies, or none: it keeps what it
runs). Each accepted document is kept on disk (STATE_DIR/trust/desired/), so a document cleared from the broker
is still in force after a restart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from pydantic import ValidationError

from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.core.errors import EdgefleetError, SignatureError
from edgefleet.core.messages import Desired, MessageError, SignedDesired, decode
from edgefleet.core.topics import DEFAULT_SLOT
from edgefleet.core.trust.keyset import verify_payload

log = logging.getLogger(__name__)

COUNTERS_FILE = "trust/counters.json"
DOCUMENTS_DIR = "trust/desired"
Scope = Literal["device", "group"]


def counter_key(target: str, slot: str = DEFAULT_SLOT) -> str:
    """Where the highest counter of a (target, slot) is kept: `device:x@detector`."""
    return f"{target}@{slot}"


class DesiredRefused(EdgefleetError):
    """A desired document this device will not act on; the message says why."""


class DesiredState:
    def __init__(
        self,
        device_id: str,
        groups: list[str],
        trust: DeviceTrust,
        store: Store,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.device_id, self.groups, self.trust, self.store, self.clock = device_id, groups, trust, store, clock
        self._lock = threading.Lock()
        self._device: dict[str, Desired] = {}  # slot -> this device's own document
        self._group: dict[tuple[str, str], Desired] = {}  # (group, slot) -> the group's document
        self._counters = self._load_counters()
        self.refusals = 0
        self._load_documents()

    # --- accepting documents (MQTT network thread)
    def on_message(self, scope: Scope, group: str | None, slot: str, payload: bytes) -> bool:
        """Take a message from slot `slot`'s desired topic. True when what the slot should run may have changed;
        DesiredRefused when the document must not be acted on (the caller reports it)."""
        try:
            if not payload:  # someone cleared the retained document: unsigned, so nothing changes
                raise DesiredRefused(
                    "an empty message cleared this desired topic; a clear must be a signed document, so the "
                    "document in force stays (and the bundle and floor with it)"
                )
            desired = self._verified(scope, group, slot, payload)
        except DesiredRefused:
            self.refusals += 1
            raise
        self._apply(scope, group, slot, desired)
        try:
            self.store.write_blob(self._document_file(scope, group, slot), payload)
        except OSError as err:  # a full disk: the document is in force now; after a restart the broker's copy is
            log.error("could not keep the desired document for %s on disk: %s", group or "this device", err)
        return True

    def _apply(self, scope: Scope, group: str | None, slot: str, desired: Desired) -> None:
        kept = None if desired.clear else desired
        with self._lock:
            if scope == "device":
                if kept is None:
                    self._device.pop(slot, None)
                else:
                    self._device[slot] = kept
            elif group is not None:
                if kept is None:
                    self._group.pop((group, slot), None)
                else:
                    self._group[(group, slot)] = kept

    @staticmethod
    def _document_file(scope: Scope, group: str | None, slot: str) -> str:
        name = "device.json" if scope == "device" else f"group-{group}.json"
        return f"{DOCUMENTS_DIR}/{slot}/{name}"

    def _load_documents(self) -> None:
        """The documents accepted before a restart, verified again (signature, target, slot, counter)."""
        folder = self.store.root / DOCUMENTS_DIR
        slots = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        scopes: list[tuple[Scope, str | None]] = [("device", None), *(("group", g) for g in self.groups)]
        for slot in slots:
            for scope, group in scopes:
                raw = self.store.read_blob(self._document_file(scope, group, slot))
                if not raw:
                    continue
                try:
                    self._apply(scope, group, slot, self._verified(scope, group, slot, raw))
                except DesiredRefused as err:
                    where = f"{group or 'this device'}/{slot}"
                    log.warning("kept desired document for %s no longer holds: %s", where, err)

    def _verified(self, scope: Scope, group: str | None, slot: str, payload: bytes) -> Desired:
        try:
            signed = decode(SignedDesired, payload)
        except MessageError as err:
            raise DesiredRefused(f"not a signed desired document ({err})") from err
        try:
            self.trust.consider(signed.keyset)
            text = verify_payload("desired", signed.desired, self.trust.keys("ops"))
        except SignatureError as err:
            raise DesiredRefused(f"desired document not signed by a trusted operations key: {err}") from err
        try:
            desired = Desired.model_validate_json(text)
        except ValidationError as err:
            raise DesiredRefused(f"signed desired document is malformed: {err.errors()[0]['msg']}") from err
        expected = f"device:{self.device_id}" if scope == "device" else f"group:{group}"
        if desired.target != expected:
            raise DesiredRefused(f"desired document is bound to {desired.target or '(nothing)'!r}, not {expected!r}")
        if desired.slot != slot:
            raise DesiredRefused(f"desired document is for slot {desired.slot!r}, not {slot!r} (its topic's)")
        key = counter_key(expected, slot)
        digest = hashlib.sha256(signed.desired.signature.encode()).hexdigest()
        with self._lock:
            high, high_digest = self._counters.get(key, (0, ""))
            if desired.counter < high:
                raise DesiredRefused(
                    f"replayed desired document: counter {desired.counter} is below {high}, the highest accepted "
                    f"for {expected} slot {slot}"
                )
            if desired.counter == high and digest != high_digest:
                raise DesiredRefused(f"a different desired document reuses counter {high} for {expected} slot {slot}")
            renewed = desired.counter > high
            if desired.expires_at <= self.clock() and renewed:
                raise DesiredRefused(
                    f"desired document for {expected} slot {slot} (counter {desired.counter}) expired at "
                    f"{desired.expires_at:.0f}; not acting on it"
                )
            if renewed:
                self._counters[key] = (desired.counter, digest)
                self._save_counters()
        return desired

    # --- what to run (install workers)
    def slots(self) -> list[str]:
        """Every slot some document in force names (removed ones included: their removal is in force)."""
        with self._lock:
            named = set(self._device) | {slot for group, slot in self._group if group in self.groups}
        return sorted(named)

    def effective(self, slot: str = DEFAULT_SLOT) -> Desired | None:
        """The document in force for `slot`: this device's own, else its first group's. None when there is none,
        or when the one in force has expired (the slot keeps what it runs)."""
        desired = self._in_force(slot)
        if desired is None or desired.expires_at <= self.clock():
            return None
        return desired

    def stale(self, slot: str = DEFAULT_SLOT) -> str | None:
        """Why `slot`'s desired state is stale, or None while its document in force is unexpired."""
        desired = self._in_force(slot)
        if desired is None or desired.expires_at > self.clock():
            return None
        return (
            f"desired state stale: the document for {desired.target} slot {slot} (counter {desired.counter}) expired "
            f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(desired.expires_at))} and no newer one arrived; "
            "keeping what runs"
        )

    def stale_any(self) -> str | None:
        """The first slot's staleness (the device's status says one)."""
        return next((why for slot in self.slots() if (why := self.stale(slot))), None)

    def _in_force(self, slot: str) -> Desired | None:
        with self._lock:
            if slot in self._device:
                return self._device[slot]
            for group in self.groups:
                if (group, slot) in self._group:
                    return self._group[(group, slot)]
            return None

    # --- persistence (through the store's serialized path)
    def _load_counters(self) -> dict[str, tuple[int, str]]:
        raw = self.store.read_blob(COUNTERS_FILE)
        if raw is None:
            return {}
        try:
            data = json.loads(raw)
            # A key without a slot was written by a single-model agent: it counts for the default slot.
            return {counter_key(*str(t).split("@", 1)): (int(v[0]), str(v[1])) for t, v in data.items()}
        except (ValueError, TypeError, IndexError, AttributeError) as err:
            log.error("desired-state counters unreadable (%s); starting from none", err)
            return {}

    def _save_counters(self) -> None:
        self.store.write_blob(COUNTERS_FILE, json.dumps({t: list(v) for t, v in self._counters.items()}).encode())
