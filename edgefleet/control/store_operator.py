"""The store's operator side: API tokens (hashed), the audit trail, and the bundles published so far.

`Store` inherits these abstract methods; each backend implements them (SQLite: store_sqlite_operator.py). They
live in the store, not in a web process, so any control-plane instance serves the dashboard for any operator.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgefleet.control.store import BundleRecord


@dataclass(frozen=True)
class ApiToken:
    """An operator's token as stored: its name and the sha256 of the secret (the secret itself is never kept)."""

    name: str
    token_hash: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None

    def valid(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True)
class AuditEntry:
    """One state-changing request: who (token name, or the CLI user), what, on what, and how it ended."""

    ts: float
    actor: str
    action: str
    target: str
    outcome: str = field(metadata={"doc": "'ok', or 'refused: why' / 'failed: why'"})
    detail: Mapping[str, Any] = field(default_factory=dict)
    via: str = "dashboard"
    remote: str | None = None
    id: int | None = None


class OperatorStore(abc.ABC):
    # --- API tokens
    @abc.abstractmethod
    def put_token(self, token: ApiToken) -> None:
        """Insert a token, or replace the token of the same name (the old secret stops working)."""

    @abc.abstractmethod
    def token_by_hash(self, token_hash: str) -> ApiToken | None: ...

    @abc.abstractmethod
    def tokens(self) -> list[ApiToken]: ...

    @abc.abstractmethod
    def revoke_token(self, name: str, now: float) -> bool:
        """Revoke a token by name; False when no such token is live."""

    # --- audit trail
    @abc.abstractmethod
    def add_audit(self, entry: AuditEntry) -> int:
        """Append an entry; returns its id. Entries are never updated."""

    @abc.abstractmethod
    def audit(self, limit: int = 100, actor: str | None = None, since: float = 0.0) -> list[AuditEntry]:
        """The newest `limit` entries (optionally of one actor), newest first."""

    # --- published bundles
    @abc.abstractmethod
    def bundle_records(self, limit: int = 200) -> list[BundleRecord]:
        """Bundles recorded when they were published, newest first."""
