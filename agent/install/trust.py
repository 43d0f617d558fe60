"""What this device trusts: the pinned root key(s) and the highest root-signed key set it has seen.

The key set arrives inside offers and desired documents (or from `--keyset` at first start). A new one is adopted
only if root signed it, it has not expired and its version is higher than the one held; the version never goes
down, so an attacker replaying an old key set (one that still lists a revoked key) gets nowhere. The key set is
kept in STATE_DIR/trust/keyset.json, written through the store's serialized path.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from edgefleet.agent.install.store import Store
from edgefleet.core.errors import SignatureError
from edgefleet.core.messages import SignedPayload
from edgefleet.core.trust.keyset import KeySet, Role, public_from_pem, verify_keyset
from edgefleet.core.trust.signing import TrustedKeys, key_id

log = logging.getLogger(__name__)

KEYSET_FILE = "trust/keyset.json"


class DeviceTrust:
    def __init__(self, root: TrustedKeys, store: Store, initial: Path | None = None) -> None:
        self.root, self.store = root, store
        self._lock = threading.Lock()
        self._signed: SignedPayload | None = None
        self._keyset: KeySet | None = None
        stored = store.read_blob(KEYSET_FILE)
        if stored is not None:
            try:
                self._adopt_checked(SignedPayload.model_validate_json(stored), persist=False, now=0.0)
            except (ValueError, SignatureError) as err:
                log.error("stored key set is unusable (%s); waiting for a new one", err)
        if initial is not None:
            try:
                self.consider(SignedPayload.model_validate_json(initial.read_bytes()))
            except (OSError, ValueError, SignatureError) as err:
                log.error("key set %s not adopted: %s", initial, err)

    @property
    def version(self) -> int:
        return self._keyset.version if self._keyset else 0

    def consider(self, signed: SignedPayload | None) -> bool:
        """Adopt `signed` if it is a valid, newer key set; True when adopted. A bad one raises SignatureError;
        an older valid one is ignored (offers published before a rotation carry one)."""
        if signed is None:
            return False
        return self._adopt_checked(signed, persist=True, now=None)

    def _adopt_checked(self, signed: SignedPayload, *, persist: bool, now: float | None) -> bool:
        keyset = verify_keyset(signed, self.root, now=0.0)  # signature and shape; expiry below
        with self._lock:
            if self._keyset is not None and keyset.version <= self._keyset.version:
                return False  # the one held (even once expired) stays in force until a newer one arrives
            if now is None:
                verify_keyset(signed, self.root)  # a NEW key set must not be expired
            if persist:
                self.store.write_blob(KEYSET_FILE, signed.model_dump_json().encode())
            self._signed, self._keyset = signed, keyset
        log.info("key set version %d adopted (bundle %s, ops %s)", keyset.version,
                 sorted(keyset.roles.get("bundle", {})), sorted(keyset.roles.get("ops", {})))  # fmt: skip
        return True

    def keys(self, role: Role) -> TrustedKeys:
        """The keys trusted for `role` now; SignatureError if no key set was ever adopted."""
        keyset = self._keyset
        if keyset is None:
            raise SignatureError("no root-signed key set yet: cannot trust any bundle or operations key")
        trusted = keyset.trusted(role)
        if not trusted.ids:
            raise SignatureError(f"the key set (version {keyset.version}) delegates no {role} key")
        return trusted

    def revoked(self, key_id: str) -> bool:
        return self._keyset is not None and key_id in self._keyset.revoked

    def installed_keys(self, signer_pem: str | None) -> TrustedKeys:
        """Keys an installed bundle's offer may be signed by: the current bundle role, plus the key that signed it
        at install time if that key was only rotated out (never revoked)."""
        keys = self._keyset.trusted("bundle").public_keys() if self._keyset else {}
        if signer_pem:
            public = public_from_pem(signer_pem)
            if not self.revoked(key_id(public)):
                keys[key_id(public)] = public
        return TrustedKeys(keys)
