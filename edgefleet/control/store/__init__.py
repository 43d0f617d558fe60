"""The control plane's store behind a URL (SQLite or PostgreSQL): one repository per area over one database.

- `open_store(url)` → `Store`: `sqlite:///var/lib/edgefleet/control.sqlite` (one file, the embedded default for
  one machine) or `postgresql://user@host/edgefleet` (several control-plane instances on several machines).
- `Store.repos`: `devices` (registry and groups), `reports` (telemetry, events, counters, compaction), `quality`
  (quality figures and alerts), `evidence` (bundle facts, link counters, commits), `rollouts` (desired state,
  rollouts, leases), `operator` (tokens, dashboard sessions, audit, published bundles), `health` (each
  instance's loops); each a Protocol with one SQL implementation.
  `Store`'s own methods hand each call to its repository, so callers that need the whole store keep one object.
- The records they hold (`records`), the two errors, and the write-latency histogram helpers.

Both databases run the same SQL (`sql.database.Dialect` covers the few differences) and migrate their schema on
open (`sql.migrate`, `sql/migrations/<dialect>/NNNN_*.sql`).
"""

from edgefleet.control.store.devices import Devices
from edgefleet.control.store.errors import FencedOut, StoreError
from edgefleet.control.store.evidence import Evidence
from edgefleet.control.store.health import Health
from edgefleet.control.store.open import open_database, open_store
from edgefleet.control.store.operator import Operator
from edgefleet.control.store.quality import Quality
from edgefleet.control.store.quality_alerts import band_rank
from edgefleet.control.store.quota import QuotaCut
from edgefleet.control.store.records import (
    ANY_PROFILE,
    FLEET_TARGET,
    AgentReleaseTarget,
    AlertLevel,
    AlertRecord,
    ApiToken,
    AuditEntry,
    BundleRecord,
    Compaction,
    ComponentHealthRow,
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
from edgefleet.control.store.reports import WRITE_MS_COUNTER, Reports, write_ms_quantile
from edgefleet.control.store.rollouts import Rollouts
from edgefleet.control.store.store import Repositories, Store

__all__ = [
    "ANY_PROFILE",
    "FLEET_TARGET",
    "WRITE_MS_COUNTER",
    "AgentReleaseTarget",
    "AlertLevel",
    "AlertRecord",
    "ApiToken",
    "AuditEntry",
    "BundleRecord",
    "Compaction",
    "ComponentHealthRow",
    "DashboardSession",
    "Deployment",
    "DeviceRecord",
    "Devices",
    "EventRecord",
    "Evidence",
    "Fence",
    "FencedOut",
    "GroupDef",
    "Health",
    "LinkSample",
    "Operator",
    "PublishedDesired",
    "Quality",
    "QualityPoint",
    "QuotaCut",
    "Reports",
    "Repositories",
    "RolloutRow",
    "Rollouts",
    "Scope",
    "SeriesPoint",
    "SlotKey",
    "SlotPolicy",
    "Store",
    "StoreError",
    "TelemetryPoint",
    "band_rank",
    "open_database",
    "open_store",
    "write_ms_quantile",
]
