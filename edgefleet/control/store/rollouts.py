"""The rollouts repository: desired state (deployments per scope, what was last published per device), rollouts
and their pending commands, and the leases that say which control-plane instance drives them.

Rollout-state writes (rollouts, deployments, published desired state, taken commands) go through
`fenced_tx`: a repository made by `fenced(fence)` writes them only while its lease term is current, checked in
the write's own transaction (`FencedOut` otherwise, nothing written).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from edgefleet.control.store.errors import FencedOut
from edgefleet.control.store.records import (
    AgentReleaseTarget,
    Deployment,
    Fence,
    PublishedDesired,
    RolloutRow,
    Scope,
    SlotKey,
    SlotPolicy,
)
from edgefleet.control.store.sql.database import Database, Db, unit_of_work
from edgefleet.core.errors import UnknownNameError


class Rollouts(Protocol):
    """Desired state, rollouts and leases; `fenced` makes a view whose rollout-state writes need a lease term."""

    def put_deployment(self, deployment: Deployment) -> None: ...

    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None, slot: str | None = None) -> int:
        """Delete a target's deployments (of one profile, of one slot; None: every one)."""
        ...

    def deployments(self) -> list[Deployment]: ...

    def put_slot_policy(self, policy: SlotPolicy) -> None:
        """Set how a scope's devices schedule one slot (replacing that scope's earlier policy of the slot)."""
        ...

    def delete_slot_policy(self, scope: Scope, target: str, slot: str) -> int: ...

    def slot_policies(self) -> list[SlotPolicy]: ...

    def put_agent_release(self, target: AgentReleaseTarget) -> None:
        """Name an agent release in a device's desired documents (replacing the one named before)."""
        ...

    def delete_agent_release(self, device_id: str) -> int: ...

    def agent_releases(self) -> dict[str, AgentReleaseTarget]:
        """device id → the agent release its desired documents name."""
        ...

    def published(self) -> dict[SlotKey, PublishedDesired]:
        """What was last published per (device, slot)."""
        ...

    def set_published_many(self, records: Sequence[tuple[SlotKey, PublishedDesired | None]]) -> None:
        """What was published (None: cleared) for many (device, slot)s, in one transaction; the last word per
        (device, slot)."""
        ...

    def save_rollout(self, row: RolloutRow) -> None:
        """Insert or update a rollout's state and document (never its pending command)."""
        ...

    def rollouts(self, states: Iterable[str] | None = None) -> list[RolloutRow]: ...

    def rollout(self, rollout_id: str) -> RolloutRow | None: ...

    def set_command(self, rollout_id: str, command: str) -> None:
        """Ask the engine to pause, resume or abort (it takes the command on its next tick)."""
        ...

    def take_command(self, rollout_id: str) -> str | None:
        """The pending command, cleared atomically."""
        ...

    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        """Take or renew a lease; the term's fencing token (>= 1) when `holder` holds it until now + ttl_s, else None.

        The token is the same for every renewal and grows whenever the lease changes hands (a release keeps it)."""
        ...

    def release_lease(self, name: str, holder: str) -> None: ...

    def lease(self, name: str) -> tuple[str, float] | None:
        """(holder, expires_at) of a lease, or None (never taken, or released)."""
        ...

    def fenced(self, fence: Fence) -> Rollouts:
        """This repository, on the same database, whose rollout-state writes each check in their transaction that
        `fence` is still the lease's current term, and raise FencedOut (writing nothing) when it is not."""
        ...


class SqlRollouts:
    def __init__(self, db: Database, fence: Fence | None = None) -> None:
        self.db, self.fence = db, fence

    def fenced(self, fence: Fence) -> SqlRollouts:
        return SqlRollouts(self.db, fence)

    @contextlib.contextmanager
    def fenced_tx(self) -> Iterator[Db]:
        """A write transaction that first checks this view's fence (if any) and keeps the lease row from changing
        hands until it commits: the write and a takeover are ordered, never interleaved."""
        with self.db.tx() as conn:
            fence = self.fence
            if fence is not None:
                row = conn.execute(
                    f"SELECT holder, token FROM leases WHERE name = ?{self.db.dialect.for_share}", (fence.lease,)
                ).fetchone()
                if row is None or (str(row[0]), int(row[1])) != (fence.holder, fence.token):
                    now = f"{row[0]} (term {row[1]})" if row and row[0] else "nobody"
                    raise FencedOut(
                        f"lease {fence.lease!r} term {fence.token} of {fence.holder} is over (now held by {now}); "
                        "the write was not made"
                    )
            yield conn

    # --- desired state
    @unit_of_work()
    def put_deployment(self, deployment: Deployment) -> None:
        d = deployment
        with self.fenced_tx() as conn:
            conn.execute(
                "INSERT INTO deployments (scope, target, profile, bundle_id, model_name, model_version, rollback,"
                " source, updated_at, shadow_bundle_id, slot, remove_slot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, target, profile, slot) DO UPDATE SET bundle_id = excluded.bundle_id,"
                " model_name = excluded.model_name, model_version = excluded.model_version,"
                " rollback = excluded.rollback, source = excluded.source, updated_at = excluded.updated_at,"
                " shadow_bundle_id = excluded.shadow_bundle_id, remove_slot = excluded.remove_slot",
                (d.scope, d.target, d.profile, d.bundle_id, d.model_name, d.model_version, int(d.rollback), d.source,
                 d.updated_at or time.time(), d.shadow_bundle_id, d.slot, int(d.remove)),
            )  # fmt: skip

    @unit_of_work()
    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None, slot: str | None = None) -> int:
        sql, params = "DELETE FROM deployments WHERE scope = ? AND target = ?", [scope, target]
        if profile is not None:
            sql += " AND profile = ?"
            params.append(profile)
        if slot is not None:
            sql += " AND slot = ?"
            params.append(slot)
        with self.fenced_tx() as conn:
            return conn.execute(sql, params).rowcount

    @unit_of_work()
    def deployments(self) -> list[Deployment]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT scope, target, profile, bundle_id, model_name, model_version, rollback, source, updated_at,"
                " shadow_bundle_id, slot, remove_slot FROM deployments ORDER BY scope, target, profile, slot"
            ).fetchall()
        return [
            Deployment(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9], r[10], bool(r[11]))
            for r in rows
        ]

    @unit_of_work()
    def put_slot_policy(self, policy: SlotPolicy) -> None:
        p = policy
        with self.fenced_tx() as conn:
            conn.execute(
                "INSERT INTO slot_policies (scope, target, slot, slot_class, latency_objective_ms, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, target, slot) DO UPDATE SET"
                " slot_class = excluded.slot_class, latency_objective_ms = excluded.latency_objective_ms,"
                " updated_at = excluded.updated_at",
                (p.scope, p.target, p.slot, p.slot_class, p.latency_objective_ms, p.updated_at or time.time()),
            )

    @unit_of_work()
    def delete_slot_policy(self, scope: Scope, target: str, slot: str) -> int:
        with self.fenced_tx() as conn:
            return conn.execute(
                "DELETE FROM slot_policies WHERE scope = ? AND target = ? AND slot = ?", (scope, target, slot)
            ).rowcount

    @unit_of_work()
    def slot_policies(self) -> list[SlotPolicy]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT scope, target, slot, slot_class, latency_objective_ms, updated_at FROM slot_policies"
                " ORDER BY scope, target, slot"
            ).fetchall()
        return [SlotPolicy(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    @unit_of_work()
    def put_agent_release(self, target: AgentReleaseTarget) -> None:
        t = target
        with self.fenced_tx() as conn:
            conn.execute(
                "INSERT INTO agent_release_targets (device_id, release_id, version, allow_downgrade_to, source,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (device_id) DO UPDATE SET"
                " release_id = excluded.release_id, version = excluded.version,"
                " allow_downgrade_to = excluded.allow_downgrade_to, source = excluded.source,"
                " updated_at = excluded.updated_at",
                (t.device_id, t.release_id, t.version, t.allow_downgrade_to, t.source, t.updated_at or time.time()),
            )

    @unit_of_work()
    def delete_agent_release(self, device_id: str) -> int:
        with self.fenced_tx() as conn:
            return conn.execute("DELETE FROM agent_release_targets WHERE device_id = ?", (device_id,)).rowcount

    @unit_of_work()
    def agent_releases(self) -> dict[str, AgentReleaseTarget]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT device_id, release_id, version, allow_downgrade_to, source, updated_at"
                " FROM agent_release_targets ORDER BY device_id"
            ).fetchall()
        return {r[0]: AgentReleaseTarget(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows}

    @unit_of_work()
    def published(self) -> dict[SlotKey, PublishedDesired]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT device_id, bundle_id, rollback, issued_at, shadow_bundle_id, slot, remove_slot, slot_class,"
                " latency_objective_ms FROM published"
            ).fetchall()
        return {
            (r[0], r[5]): PublishedDesired(r[0], r[1], bool(r[2]), r[3], r[4], r[5], bool(r[6]), r[7], r[8])
            for r in rows
        }

    @unit_of_work()
    def set_published_many(self, records: Sequence[tuple[SlotKey, PublishedDesired | None]]) -> None:
        if not records:
            return
        final = dict(records)  # the last word per (device, slot)
        cleared = [key for key, p in sorted(final.items()) if p is None]
        latest = {key: p for key, p in final.items() if p is not None}
        with self.fenced_tx() as conn:
            conn.executemany("DELETE FROM published WHERE device_id = ? AND slot = ?", cleared)
            conn.executemany(
                "INSERT INTO published (device_id, slot, bundle_id, rollback, issued_at, shadow_bundle_id,"
                " remove_slot, slot_class, latency_objective_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (device_id, slot) DO UPDATE SET"
                " bundle_id = excluded.bundle_id, rollback = excluded.rollback, issued_at = excluded.issued_at,"
                " shadow_bundle_id = excluded.shadow_bundle_id, remove_slot = excluded.remove_slot,"
                " slot_class = excluded.slot_class, latency_objective_ms = excluded.latency_objective_ms",
                [(d, slot, p.bundle_id, int(p.rollback), p.issued_at, p.shadow_bundle_id, int(p.remove),
                  p.slot_class, p.latency_objective_ms)
                 for (d, slot), p in sorted(latest.items())],
            )  # fmt: skip

    # --- rollouts
    @unit_of_work()
    def save_rollout(self, row: RolloutRow) -> None:
        with self.fenced_tx() as conn:
            conn.execute(
                "INSERT INTO rollouts (id, state, doc, command, created_at, updated_at) VALUES (?, ?, ?, NULL, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET state = excluded.state, doc = excluded.doc,"
                " updated_at = excluded.updated_at",
                (row.id, row.state, row.doc, row.created_at, row.updated_at),
            )

    @unit_of_work()
    def rollouts(self, states: Iterable[str] | None = None) -> list[RolloutRow]:
        sql = "SELECT id, state, doc, created_at, updated_at, command FROM rollouts"
        params: list[Any] = []
        if states is not None:
            params = list(states)
            sql += f" WHERE state IN ({', '.join('?' for _ in params)})" if params else " WHERE 1 = 0"
        with self.db.read() as conn:
            rows = conn.execute(sql + " ORDER BY created_at", params).fetchall()
        return [RolloutRow(*r) for r in rows]

    @unit_of_work()
    def rollout(self, rollout_id: str) -> RolloutRow | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT id, state, doc, created_at, updated_at, command FROM rollouts WHERE id = ?", (rollout_id,)
            ).fetchone()
        return RolloutRow(*row) if row else None

    @unit_of_work()
    def set_command(self, rollout_id: str, command: str) -> None:
        with self.db.tx() as conn:
            if conn.execute("UPDATE rollouts SET command = ? WHERE id = ?", (command, rollout_id)).rowcount == 0:
                known = [
                    r[0] for r in conn.execute("SELECT id FROM rollouts ORDER BY created_at DESC LIMIT 20").fetchall()
                ]
                raise UnknownNameError("rollout", rollout_id, known)

    @unit_of_work()
    def take_command(self, rollout_id: str) -> str | None:
        with self.fenced_tx() as conn:
            row = conn.execute(
                f"SELECT command FROM rollouts WHERE id = ?{self.db.dialect.for_update}", (rollout_id,)
            ).fetchone()
            if row is None or row[0] is None:
                return None
            conn.execute("UPDATE rollouts SET command = NULL WHERE id = ?", (rollout_id,))
            return str(row[0])

    # --- leases
    @unit_of_work(patient=False)  # a lease renewed late is no renewal: the lease loop tries again on its next tick
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        with self.db.tx() as conn:
            conn.execute(
                "INSERT INTO leases (name, holder, expires_at, token) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,"
                " token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END"
                " WHERE leases.holder = excluded.holder OR leases.expires_at < ?",
                (name, holder, now + ttl_s, now),
            )
            row = conn.execute("SELECT holder, token FROM leases WHERE name = ?", (name,)).fetchone()
        return int(row[1]) if row and row[0] == holder else None

    @unit_of_work()
    def release_lease(self, name: str, holder: str) -> None:
        # Keep the row (and its token): a term number must never be handed out twice.
        with self.db.tx() as conn:
            conn.execute(
                "UPDATE leases SET holder = '', expires_at = 0, token = token + 1 WHERE name = ? AND holder = ?",
                (name, holder),
            )

    @unit_of_work()
    def lease(self, name: str) -> tuple[str, float] | None:
        with self.db.read() as conn:
            row = conn.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
        return (str(row[0]), float(row[1])) if row and row[0] else None
