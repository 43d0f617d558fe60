"""What the store holds, as frozen records: devices and groups, reports and their history, quality figures and
alerts, desired state and rollouts, leases, and the operator's tokens, audit trail and published bundles.

Every repository reads and writes these; none of them knows SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from edgefleet.core.messages import (
    DriftScore,
    GenerationStats,
    GoldenTask,
    OutputScore,
    ShadowReport,
    SlotClass,
    SlotStatus,
)
from edgefleet.core.topics import DEFAULT_SLOT

Scope = Literal["fleet", "group", "device"]
FLEET_TARGET = "*"
ANY_PROFILE = "*"  # a slot removal applies whatever the device's profile
SlotKey = tuple[str, str]  # (device id, slot): what desired state, telemetry and rollouts are kept per


@dataclass(frozen=True)
class Fence:
    """A lease term: `token` grows every time the lease changes hands, so a write that carries an old token
    (from a holder that stalled past its lease while another took over) is refused in the same transaction."""

    lease: str
    holder: str
    token: int


@dataclass(frozen=True)
class DeviceRecord:
    """What the control plane knows about one device: its last retained status plus operator labels."""

    device_id: str
    online: bool
    state: str
    profile: str | None
    groups: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    agent_version: str = ""
    arch: str | None = None
    os: str | None = None
    hostname: str | None = None
    slots: tuple[SlotStatus, ...] = ()  # every slot the device reported, by name (a single model: "default")
    last_error: str | None = None  # the device's own (a slot's is on the slot)
    status_ts: float = 0.0
    first_seen: float = 0.0

    def slot(self, name: str = DEFAULT_SLOT) -> SlotStatus | None:
        """The device's word on one slot, or None (it never reported that slot)."""
        return next((s for s in self.slots if s.slot == name), None)

    def running(self, slot: str = DEFAULT_SLOT) -> str | None:
        """The bundle the slot runs, by the device's word (None: the slot runs nothing)."""
        found = self.slot(slot)
        return found.active_bundle if found else None


@dataclass(frozen=True)
class TelemetryPoint:
    device_id: str
    seq: int | None
    ts: float
    bundle_id: str | None
    provider: str | None
    window_s: float
    requests: int
    errors: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    latency_count: int
    golden_agreement: float | None
    golden_max_abs_error: float | None
    cpu_percent: float
    rss_mb: float
    temperature_c: float | None
    slot: str = DEFAULT_SLOT


@dataclass(frozen=True)
class SeriesPoint:
    """One step of a device's history: raw reports or downsampled buckets, averaged over the step."""

    ts: float
    p50_ms: float | None
    p95_ms: float | None
    golden_agreement: float | None
    requests: int
    errors: int
    reports: int
    bundle_id: str | None


@dataclass(frozen=True)
class QualityPoint:
    """What one report said about model quality: per-output golden scores, field accuracy, drift, shadow."""

    device_id: str
    seq: int | None
    ts: float
    bundle_id: str | None
    field_accuracy: float | None = None
    field_samples: int = 0
    probe_requests: int = 0
    golden: tuple[OutputScore, ...] = ()
    drift: tuple[DriftScore, ...] = ()
    shadow: ShadowReport | None = None
    golden_task: GoldenTask | None = None  # the task rule's score on the golden set
    generation: GenerationStats | None = None  # a language model's token figures over the report's window
    slot: str = DEFAULT_SLOT


AlertLevel = Literal["info", "warning", "critical"]


@dataclass(frozen=True)
class AlertRecord:
    """A control-plane event: a device crossed a drift band or its golden check turned (ingestion raises it)."""

    device_id: str
    ts: float
    kind: str
    subject: str
    level: AlertLevel
    bundle_id: str | None
    detail: str


@dataclass(frozen=True)
class EventRecord:
    device_id: str
    seq: int | None
    ts: float
    kind: str
    bundle_id: str | None
    detail: str
    progress: float | None
    slot: str | None = None  # None: an event about the device itself


@dataclass(frozen=True)
class GroupDef:
    """A host-side group: a static list of devices and/or a label selector; priority orders overlaps."""

    name: str
    devices: tuple[str, ...] = ()
    selector: str | None = None
    priority: int = 0


@dataclass(frozen=True)
class Deployment:
    """A desired bundle for one slot of a scope (the whole fleet, a group, a device) and one profile. `remove`: a
    decision that the slot runs nothing there (published signed as `Desired.remove`); its bundle fields are empty
    and its profile may be `ANY_PROFILE`."""

    scope: Scope
    target: str
    profile: str
    bundle_id: str
    model_name: str
    model_version: str
    rollback: bool = False
    source: str = "operator"
    updated_at: float = 0.0
    shadow_bundle_id: str | None = None  # a bundle the devices run beside it on mirrored requests, never serving
    slot: str = DEFAULT_SLOT
    remove: bool = False


@dataclass(frozen=True)
class PublishedDesired:
    """What the control plane last published, retained, on one slot's desired topic of a device."""

    device_id: str
    bundle_id: str
    rollback: bool
    issued_at: float
    shadow_bundle_id: str | None = None
    slot: str = DEFAULT_SLOT
    remove: bool = False
    slot_class: SlotClass = "interactive"
    latency_objective_ms: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.device_id, self.slot


@dataclass(frozen=True)
class AgentReleaseTarget:
    """The agent release the control plane names in every desired document of one device (its launcher trials it
    under a health gate, docs/agent.md); `source` says who set it (`rollout:ID`)."""

    device_id: str
    release_id: str
    version: str
    allow_downgrade_to: str | None = None
    source: str = ""
    updated_at: float = 0.0


@dataclass(frozen=True)
class SlotPolicy:
    """How the devices of a scope (the whole fleet, a group, a device) schedule one slot: its class (real-time,
    interactive, batch) and, for a real-time slot, its p95 latency objective (the neighbour guardrail's bar).
    Resolved like deployments (device > highest-priority group > fleet) but kept apart from them: a rollout of a
    new bundle keeps the slot's policy, and a new policy publishes no new bundle."""

    scope: Scope
    target: str
    slot: str
    slot_class: SlotClass
    latency_objective_ms: float | None = None
    updated_at: float = 0.0


@dataclass(frozen=True)
class BundleRecord:
    bundle_id: str
    model_name: str
    model_version: str
    profile: str
    size: int
    accuracy_budget: float | None
    published_at: float


@dataclass(frozen=True)
class RolloutRow:
    """A rollout as stored: its state column (for queries) and its whole document as JSON."""

    id: str
    state: str
    doc: str
    created_at: float
    updated_at: float
    command: str | None = None


@dataclass(frozen=True)
class LinkSample:
    """A device's link counters in one report (`Telemetry.link`), with when the host received it."""

    received_at: float
    bulk_bytes: int  # bundle bytes received since its agent started
    clock_s: float  # the agent's monotonic clock


@dataclass(frozen=True)
class Compaction:
    downsampled_reports: int
    deleted_raw: int
    deleted_rollups: int
    deleted_events: int


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


@dataclass(frozen=True)
class DashboardSession:
    """A dashboard login as the server holds it: the sha256 of the opaque id in the cookie, the token it was made
    from (its hash: re-issuing or revoking the token ends it), its CSRF token, and when it ends."""

    id_hash: str
    token_hash: str
    csrf: str
    created_at: float
    expires_at: float
    revoked_at: float | None = None

    def valid(self, now: float) -> bool:
        return self.revoked_at is None and now < self.expires_at


@dataclass(frozen=True)
class ComponentHealthRow:
    """One control-plane instance's loop as that instance last wrote it (edgefleet/control/health.py)."""

    component: str  # "rollout-engine", "desired-sync", "rights-sync"
    holder: str  # the instance (host:pid:name)
    interval_s: float  # how often it should complete
    last_tick: float | None  # when it last completed (None: never)
    errors_per_min: int
    last_error: str
    last_error_at: float | None
    active: bool  # False: it does not run in this instance now (not the lease holder)
    active_since: float | None  # when it became active (what a loop that never completed is measured from)
    updated_at: float  # when the instance wrote this row
