"""The operator repository: API tokens (hashed), dashboard sessions, the audit trail, and the bundles published so far.

They live in the store, not in a web process, so any control-plane instance serves the dashboard for any
operator. The tables come from the versioned migrations (`migrations/*/0004_operator_tokens_audit.sql`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from edgefleet.control.store.records import ApiToken, AuditEntry, BundleRecord, DashboardSession
from edgefleet.control.store.sql.database import Database, unit_of_work

_TOKEN_COLUMNS = "name, token_hash, created_at, expires_at, revoked_at"
_SESSION_COLUMNS = "id_hash, token_hash, csrf, created_at, expires_at, revoked_at"
_AUDIT_COLUMNS = "id, ts, actor, action, target, outcome, detail_json, via, remote"
_BUNDLE_COLUMNS = "bundle_id, model_name, model_version, profile, size, accuracy_budget, published_at"


class Operator(Protocol):
    """Operator tokens, the audit trail and the publish history (which bundles exist)."""

    def put_token(self, token: ApiToken) -> None:
        """Insert a token, or replace the token of the same name (the old secret stops working)."""
        ...

    def token_by_hash(self, token_hash: str) -> ApiToken | None: ...

    def tokens(self) -> list[ApiToken]: ...

    def revoke_token(self, name: str, now: float) -> bool:
        """Revoke a token by name; False when no such token is live."""
        ...

    def put_session(self, session: DashboardSession) -> None:
        """Record a new dashboard session (and drop sessions that ended more than a day ago)."""
        ...

    def session(self, id_hash: str) -> DashboardSession | None: ...

    def revoke_session(self, id_hash: str, now: float) -> bool:
        """End a session (logout); False when it was not live."""
        ...

    def add_audit(self, entry: AuditEntry) -> int:
        """Append an entry; returns its id. Entries are never updated."""
        ...

    def audit(self, limit: int = 100, actor: str | None = None, since: float = 0.0) -> list[AuditEntry]:
        """The newest `limit` entries (optionally of one actor), newest first."""
        ...

    def put_bundle(self, bundle: BundleRecord) -> None: ...

    def bundle(self, bundle_id: str) -> BundleRecord | None: ...

    def bundle_records(self, limit: int = 200) -> list[BundleRecord]:
        """Bundles recorded when they were published, newest first."""
        ...


def _audit(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(
        id=row[0], ts=row[1], actor=row[2], action=row[3], target=row[4], outcome=row[5],
        detail=json.loads(row[6]), via=row[7], remote=row[8],
    )  # fmt: skip


class SqlOperator:
    def __init__(self, db: Database) -> None:
        self.db = db

    @unit_of_work()
    def put_token(self, token: ApiToken) -> None:
        t = token
        with self.db.tx() as conn:
            conn.execute("DELETE FROM api_tokens WHERE name = ?", (t.name,))
            conn.execute(
                f"INSERT INTO api_tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (t.name, t.token_hash, t.created_at, t.expires_at, t.revoked_at),
            )

    @unit_of_work()
    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = ?", (token_hash,)
            ).fetchone()
        return ApiToken(*row) if row else None

    @unit_of_work()
    def tokens(self) -> list[ApiToken]:
        with self.db.read() as conn:
            rows = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens ORDER BY name").fetchall()
        return [ApiToken(*r) for r in rows]

    @unit_of_work()
    def revoke_token(self, name: str, now: float) -> bool:
        with self.db.tx() as conn:
            cursor = conn.execute(
                "UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (now, name)
            )
            return bool(cursor.rowcount > 0)

    @unit_of_work()
    def put_session(self, session: DashboardSession) -> None:
        s = session
        with self.db.tx() as conn:
            conn.execute("DELETE FROM dashboard_sessions WHERE expires_at < ?", (s.created_at - 86400.0,))
            conn.execute(
                f"INSERT INTO dashboard_sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                (s.id_hash, s.token_hash, s.csrf, s.created_at, s.expires_at, s.revoked_at),
            )

    @unit_of_work()
    def session(self, id_hash: str) -> DashboardSession | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM dashboard_sessions WHERE id_hash = ?", (id_hash,)
            ).fetchone()
        return DashboardSession(*row) if row else None

    @unit_of_work()
    def revoke_session(self, id_hash: str, now: float) -> bool:
        with self.db.tx() as conn:
            cursor = conn.execute(
                "UPDATE dashboard_sessions SET revoked_at = ? WHERE id_hash = ? AND revoked_at IS NULL", (now, id_hash)
            )
            return bool(cursor.rowcount > 0)

    @unit_of_work()
    def add_audit(self, entry: AuditEntry) -> int:
        e = entry
        with self.db.tx() as conn:
            row = conn.execute(
                "INSERT INTO audit (ts, actor, action, target, outcome, detail_json, via, remote)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (e.ts, e.actor, e.action, e.target, e.outcome, json.dumps(dict(e.detail), default=str), e.via,
                 e.remote),
            ).fetchone()  # fmt: skip
        return int(row[0])

    @unit_of_work()
    def audit(self, limit: int = 100, actor: str | None = None, since: float = 0.0) -> list[AuditEntry]:
        query = f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE ts >= ?"
        params: list[object] = [since]
        if actor is not None:
            query += " AND actor = ?"
            params.append(actor)
        with self.db.read() as conn:
            rows = conn.execute(query + " ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [_audit(r) for r in rows]

    @unit_of_work()
    def put_bundle(self, bundle: BundleRecord) -> None:
        b = bundle
        with self.db.tx() as conn:
            conn.execute(
                f"INSERT INTO bundles ({_BUNDLE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (bundle_id)"
                " DO UPDATE SET size = excluded.size, published_at = excluded.published_at",
                (b.bundle_id, b.model_name, b.model_version, b.profile, b.size, b.accuracy_budget, b.published_at),
            )

    @unit_of_work()
    def bundle(self, bundle_id: str) -> BundleRecord | None:
        with self.db.read() as conn:
            row = conn.execute(f"SELECT {_BUNDLE_COLUMNS} FROM bundles WHERE bundle_id = ?", (bundle_id,)).fetchone()
        return BundleRecord(*row) if row else None

    @unit_of_work()
    def bundle_records(self, limit: int = 200) -> list[BundleRecord]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_BUNDLE_COLUMNS} FROM bundles ORDER BY published_at DESC, bundle_id LIMIT ?", (limit,)
            ).fetchall()
        return [BundleRecord(*r) for r in rows]
