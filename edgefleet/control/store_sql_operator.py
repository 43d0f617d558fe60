"""The operator tables in SQL: API tokens, the audit trail, the list of published bundles.

Written once, with `?` placeholders, in SQL that SQLite 3.35+ and PostgreSQL both run (`INSERT … RETURNING`); a
backend mixes `OperatorSql` in and supplies `_read()` (a connection for queries) and `_tx()` (one write
transaction), each yielding an object with `execute(sql, params)`. The tables come from the versioned migrations
(edgefleet/control/migrations/*/0004_operator_tokens_audit.sql).
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from edgefleet.control.store import BundleRecord
from edgefleet.control.store_operator import ApiToken, AuditEntry, OperatorStore

_TOKEN_COLUMNS = "name, token_hash, created_at, expires_at, revoked_at"
_AUDIT_COLUMNS = "id, ts, actor, action, target, outcome, detail_json, via, remote"


def _audit(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(
        id=row[0], ts=row[1], actor=row[2], action=row[3], target=row[4], outcome=row[5],
        detail=json.loads(row[6]), via=row[7], remote=row[8],
    )  # fmt: skip


class OperatorSql(OperatorStore):
    @abc.abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Any]:
        """A connection for queries."""

    @abc.abstractmethod
    def _tx(self) -> contextlib.AbstractContextManager[Any]:
        """One write transaction."""

    def put_token(self, token: ApiToken) -> None:
        t = token
        with self._tx() as db:
            db.execute("DELETE FROM api_tokens WHERE name = ?", (t.name,))
            db.execute(
                f"INSERT INTO api_tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (t.name, t.token_hash, t.created_at, t.expires_at, t.revoked_at),
            )

    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        with self._read() as db:
            row = db.execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = ?", (token_hash,)).fetchone()
        return ApiToken(*row) if row else None

    def tokens(self) -> list[ApiToken]:
        with self._read() as db:
            rows = db.execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens ORDER BY name").fetchall()
        return [ApiToken(*r) for r in rows]

    def revoke_token(self, name: str, now: float) -> bool:
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (now, name)
            )
            return bool(cursor.rowcount > 0)

    def add_audit(self, entry: AuditEntry) -> int:
        e = entry
        with self._tx() as db:
            row = db.execute(
                "INSERT INTO audit (ts, actor, action, target, outcome, detail_json, via, remote)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (e.ts, e.actor, e.action, e.target, e.outcome, json.dumps(dict(e.detail), default=str), e.via,
                 e.remote),
            ).fetchone()  # fmt: skip
        return int(row[0])

    def audit(self, limit: int = 100, actor: str | None = None, since: float = 0.0) -> list[AuditEntry]:
        query = f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE ts >= ?"
        params: list[object] = [since]
        if actor is not None:
            query += " AND actor = ?"
            params.append(actor)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [_audit(r) for r in rows]

    def bundle_records(self, limit: int = 200) -> list[BundleRecord]:
        with self._read() as db:
            rows = db.execute(
                "SELECT bundle_id, model_name, model_version, profile, size, accuracy_budget, published_at"
                " FROM bundles ORDER BY published_at DESC, bundle_id LIMIT ?",
                (limit,),
            ).fetchall()
        return [BundleRecord(*r) for r in rows]
