"""`Store`: the repositories of one database, composed. Callers either take the one repository they need
(`store.repos.rollouts`) or call the store's own methods, each of which hands the call to its repository.

Every method is safe to call from several threads, and several processes may share one store: deduplication
(`UNIQUE (device_id, seq, ts)`), leases with fencing tokens and rollout commands are done in SQL, so they hold
across processes too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from edgefleet.control.store.devices import Devices, SqlDevices
from edgefleet.control.store.evidence import Evidence, SqlEvidence
from edgefleet.control.store.health import Health, SqlHealth
from edgefleet.control.store.operator import Operator, SqlOperator
from edgefleet.control.store.quality import Quality, SqlQuality
from edgefleet.control.store.quota import QuotaCut, enforce_quota
from edgefleet.control.store.records import (
    AgentReleaseTarget,
    AlertRecord,
    ApiToken,
    AuditEntry,
    BundleRecord,
    Compaction,
    DashboardSession,
    Deployment,
    DeviceRecord,
    EventRecord,
    Fence,
    GroupDef,
    LinkSample,
    PublishedDesired,
    QualityPoint,
    RolloutRow,
    Scope,
    SeriesPoint,
    SlotKey,
    SlotPolicy,
    TelemetryPoint,
)
from edgefleet.control.store.reports import Reports, SqlReports
from edgefleet.control.store.rollouts import Rollouts, SqlRollouts
from edgefleet.control.store.sql.database import Database
from edgefleet.core.messages import DeviceStatus, Event, Telemetry


@dataclass(frozen=True)
class Repositories:
    """One repository per area, over one database."""

    devices: Devices
    reports: Reports
    quality: Quality
    rollouts: Rollouts
    operator: Operator
    evidence: Evidence
    health: Health

    @classmethod
    def sql(cls, db: Database) -> Repositories:
        quality, evidence = SqlQuality(db), SqlEvidence(db)
        return cls(
            SqlDevices(db),
            SqlReports(db, quality, evidence),
            quality,
            SqlRollouts(db),
            SqlOperator(db),
            evidence,
            SqlHealth(db),
        )


class Store:
    """Everything the control plane persists, by area (`repos`)."""

    def __init__(self, db: Database, repos: Repositories | None = None, *, owner: bool = True) -> None:
        self.db = db
        self.repos = repos or Repositories.sql(db)
        self._owner = owner  # False for the fenced views `with_fence` makes: they share and never close the db

    @property
    def url(self) -> str:
        return self.db.url

    def close(self) -> None:
        if self._owner:
            self.db.close()

    def with_fence(self, fence: Fence) -> Store:
        """This store, sharing its connections, whose rollout-state writes (rollouts, deployments, published
        desired state, taken commands) each check in their transaction that `fence` is still the lease's current
        term, and raise FencedOut (writing nothing) when it is not. Closing it closes nothing."""
        repos = dataclasses.replace(self.repos, rollouts=self.repos.rollouts.fenced(fence))
        return Store(self.db, repos, owner=False)

    # --- devices and groups
    def upsert_statuses(self, statuses: Sequence[DeviceStatus], received_at: float) -> None:
        self.repos.devices.upsert_statuses(statuses, received_at)

    def devices(self) -> list[DeviceRecord]:
        return self.repos.devices.devices()

    def device(self, device_id: str) -> DeviceRecord | None:
        return self.repos.devices.device(device_id)

    def device_ids(self) -> set[str]:
        return self.repos.devices.device_ids()

    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        return self.repos.devices.set_labels(device_id, set_, remove)

    def put_group(self, group: GroupDef) -> None:
        self.repos.devices.put_group(group)

    def delete_group(self, name: str) -> bool:
        return self.repos.devices.delete_group(name)

    def groups(self) -> dict[str, GroupDef]:
        return self.repos.devices.groups()

    # --- evidence a rollout weighs reports against
    def put_bundle_facts(self, bundle_id: str, facts: str, recorded_at: float) -> None:
        self.repos.evidence.put_bundle_facts(bundle_id, facts, recorded_at)

    def bundle_facts(self, bundle_id: str) -> str | None:
        return self.repos.evidence.bundle_facts(bundle_id)

    def link_samples(self, device_id: str, received_since: float) -> list[LinkSample]:
        return self.repos.evidence.link_samples(device_id, received_since)

    def commits(self, device_id: str) -> list[tuple[str, float]]:
        return self.repos.evidence.commits(device_id)

    # --- telemetry, events, counters
    def stored_through(self, seen: Mapping[str, Sequence[int]], lost: Mapping[str, int], now: float) -> dict[str, int]:
        return self.repos.reports.stored_through(seen, lost, now)

    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        return self.repos.reports.add_telemetry(reports, received_at)

    def add_events(self, events: Sequence[Event], received_at: float) -> int:
        return self.repos.reports.add_events(events, received_at)

    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[TelemetryPoint]:  # fmt: skip
        return self.repos.reports.telemetry(device_id, since, until, bundle_id, slot)

    def latest_telemetry(self) -> dict[SlotKey, TelemetryPoint]:
        return self.repos.reports.latest_telemetry()

    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        return self.repos.reports.series(device_id, since, until, step)

    def events(
        self, device_id: str | None = None, since: float = 0.0, bundle_id: str | None = None, limit: int = 1000,
        received_since: float | None = None,
    ) -> list[EventRecord]:  # fmt: skip
        return self.repos.reports.events(device_id, since, bundle_id, limit, received_since)

    def telemetry_count(self, device_id: str | None = None) -> int:
        return self.repos.reports.telemetry_count(device_id)

    def compact(
        self, now: float, *, raw_retention_s: float, bucket_s: float, rollup_retention_s: float,
        event_retention_s: float,
    ) -> Compaction:  # fmt: skip
        return self.repos.reports.compact(
            now, raw_retention_s=raw_retention_s, bucket_s=bucket_s, rollup_retention_s=rollup_retention_s,
            event_retention_s=event_retention_s,
        )  # fmt: skip

    def downsample(self, now: float, *, raw_retention_s: float, bucket_s: float) -> tuple[int, int]:
        """Compaction: raw reports past `raw_retention_s` summed into buckets (reports moved, raw rows deleted)."""
        return self.repos.reports.downsample(now, raw_retention_s=raw_retention_s, bucket_s=bucket_s)

    def expire(
        self, now: float, *, raw_retention_s: float, bucket_s: float, rollup_retention_s: float,
        event_retention_s: float,
    ) -> tuple[int, int]:  # fmt: skip
        """Retention by age: buckets, events, quality rows and evidence past their windows (rollups, events)."""
        return self.repos.reports.expire(
            now, raw_retention_s=raw_retention_s, bucket_s=bucket_s, rollup_retention_s=rollup_retention_s,
            event_retention_s=event_retention_s,
        )  # fmt: skip

    def enforce_device_quota(self, max_bytes: int) -> list[QuotaCut]:
        """Retention by bytes (quota.py): each device over `max_bytes` loses its oldest rows."""
        return enforce_quota(self.db, max_bytes)

    def add_counters(self, deltas: Mapping[str, int]) -> None:
        self.repos.reports.add_counters(deltas)

    def counters(self) -> dict[str, int]:
        return self.repos.reports.counters()

    # --- model quality
    def quality(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None,
        slot: str | None = None,
    ) -> list[QualityPoint]:  # fmt: skip
        return self.repos.quality.quality(device_id, since, until, bundle_id, slot)

    def latest_quality(self) -> dict[SlotKey, QualityPoint]:
        return self.repos.quality.latest_quality()

    def add_alerts(self, alerts: Sequence[AlertRecord], received_at: float) -> None:
        self.repos.quality.add_alerts(alerts, received_at)

    def alerts(self, device_id: str | None = None, since: float = 0.0, limit: int = 1000) -> list[AlertRecord]:
        return self.repos.quality.alerts(device_id, since, limit)

    # --- desired state, rollouts, leases
    def put_deployment(self, deployment: Deployment) -> None:
        self.repos.rollouts.put_deployment(deployment)

    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None, slot: str | None = None) -> int:
        return self.repos.rollouts.delete_deployment(scope, target, profile, slot)

    def deployments(self) -> list[Deployment]:
        return self.repos.rollouts.deployments()

    def put_slot_policy(self, policy: SlotPolicy) -> None:
        self.repos.rollouts.put_slot_policy(policy)

    def delete_slot_policy(self, scope: Scope, target: str, slot: str) -> int:
        return self.repos.rollouts.delete_slot_policy(scope, target, slot)

    def slot_policies(self) -> list[SlotPolicy]:
        return self.repos.rollouts.slot_policies()

    def put_agent_release(self, target: AgentReleaseTarget) -> None:
        self.repos.rollouts.put_agent_release(target)

    def delete_agent_release(self, device_id: str) -> int:
        return self.repos.rollouts.delete_agent_release(device_id)

    def agent_releases(self) -> dict[str, AgentReleaseTarget]:
        return self.repos.rollouts.agent_releases()

    def published(self) -> dict[SlotKey, PublishedDesired]:
        return self.repos.rollouts.published()

    def set_published(self, key: SlotKey, published: PublishedDesired | None) -> None:
        self.repos.rollouts.set_published_many([(key, published)])

    def set_published_many(self, records: Sequence[tuple[SlotKey, PublishedDesired | None]]) -> None:
        self.repos.rollouts.set_published_many(records)

    def save_rollout(self, row: RolloutRow) -> None:
        self.repos.rollouts.save_rollout(row)

    def rollouts(self, states: Iterable[str] | None = None) -> list[RolloutRow]:
        return self.repos.rollouts.rollouts(states)

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        return self.repos.rollouts.rollout(rollout_id)

    def set_command(self, rollout_id: str, command: str) -> None:
        self.repos.rollouts.set_command(rollout_id, command)

    def take_command(self, rollout_id: str) -> str | None:
        return self.repos.rollouts.take_command(rollout_id)

    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        return self.repos.rollouts.acquire_lease(name, holder, ttl_s, now)

    def release_lease(self, name: str, holder: str) -> None:
        self.repos.rollouts.release_lease(name, holder)

    def lease(self, name: str) -> tuple[str, float] | None:
        return self.repos.rollouts.lease(name)

    # --- operator: tokens, sessions, audit, published bundles
    def put_token(self, token: ApiToken) -> None:
        self.repos.operator.put_token(token)

    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        return self.repos.operator.token_by_hash(token_hash)

    def tokens(self) -> list[ApiToken]:
        return self.repos.operator.tokens()

    def revoke_token(self, name: str, now: float) -> bool:
        return self.repos.operator.revoke_token(name, now)

    def put_session(self, session: DashboardSession) -> None:
        self.repos.operator.put_session(session)

    def session(self, id_hash: str) -> DashboardSession | None:
        return self.repos.operator.session(id_hash)

    def revoke_session(self, id_hash: str, now: float) -> bool:
        return self.repos.operator.revoke_session(id_hash, now)

    def add_audit(self, entry: AuditEntry) -> int:
        return self.repos.operator.add_audit(entry)

    def audit(self, limit: int = 100, actor: str | None = None, since: float = 0.0) -> list[AuditEntry]:
        return self.repos.operator.audit(limit, actor, since)

    def put_bundle(self, bundle: BundleRecord) -> None:
        self.repos.operator.put_bundle(bundle)

    def bundle(self, bundle_id: str) -> BundleRecord | None:
        return self.repos.operator.bundle(bundle_id)

    def bundle_records(self, limit: int = 200) -> list[BundleRecord]:
        return self.repos.operator.bundle_records(limit)
