"""The control plane's store behind a URL: devices, telemetry, events, groups, desired state, rollouts.

`store_open.open_store(url)` returns a `Store`: `sqlite:///var/lib/edgefleet/control.sqlite` (one file, the
embedded default for one machine) or `postgresql://user@host/edgefleet` (several control-plane instances on
several machines). Both backends run the same SQL (`store_sql*`) and migrate their schema on open
(`store_migrate`, `migrations/<dialect>/NNNN_*.sql`). Every method is safe to call from several threads, and
several processes may share one store: deduplication (`UNIQUE (device_id, seq, ts)`), leases with fencing
tokens and rollout commands are done in SQL, so they hold across processes too.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from edgefleet.control.store_operator import OperatorStore
from edgefleet.core.errors import EdgefleetError, UserInputError
from edgefleet.core.messages import DeviceStatus, DriftScore, Event, GoldenTask, OutputScore, ShadowReport, Telemetry

Scope = Literal["fleet", "group", "device"]
FLEET_TARGET = "*"


class StoreError(UserInputError):
    """The store URL is wrong, or the store cannot be opened."""


class FencedOut(EdgefleetError):
    """A write made under a lease that another holder has since taken over: it was not made."""


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
    active_bundle: str | None = None
    active_model: str | None = None
    provider: str | None = None
    verified: bool = False
    last_error: str | None = None
    status_ts: float = 0.0
    first_seen: float = 0.0


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


@dataclass(frozen=True)
class GroupDef:
    """A host-side group: a static list of devices and/or a label selector; priority orders overlaps."""

    name: str
    devices: tuple[str, ...] = ()
    selector: str | None = None
    priority: int = 0


@dataclass(frozen=True)
class Deployment:
    """A desired bundle for a scope (the whole fleet, a group, a device) and one profile."""

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


@dataclass(frozen=True)
class PublishedDesired:
    """What the control plane last published, retained, on a device's desired topic."""

    device_id: str
    bundle_id: str
    rollback: bool
    issued_at: float
    shadow_bundle_id: str | None = None


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
class Compaction:
    downsampled_reports: int
    deleted_raw: int
    deleted_rollups: int
    deleted_events: int


class Store(OperatorStore, abc.ABC):
    """Everything the control plane persists. Implementations must be thread-safe."""

    url: str

    @abc.abstractmethod
    def close(self) -> None: ...

    # --- devices
    @abc.abstractmethod
    def upsert_statuses(self, statuses: Sequence[DeviceStatus], received_at: float) -> None:
        """Record each device's latest status in arrival order (the broker orders one topic's messages).

        An offline status (the last will) keeps what the device last ran: the will carries no bundle."""

    @abc.abstractmethod
    def devices(self) -> list[DeviceRecord]: ...

    @abc.abstractmethod
    def device(self, device_id: str) -> DeviceRecord | None: ...

    @abc.abstractmethod
    def device_ids(self) -> set[str]: ...

    @abc.abstractmethod
    def set_labels(self, device_id: str, set_: Mapping[str, str], remove: Iterable[str] = ()) -> DeviceRecord:
        """Operator labels; an unknown device raises UnknownNameError."""

    # --- telemetry and events (at-least-once in, exactly once stored)
    @abc.abstractmethod
    def add_telemetry(self, reports: Sequence[Telemetry], received_at: float) -> int:
        """Store reports, skipping ones already stored (same device, seq and ts); returns how many were new."""

    @abc.abstractmethod
    def add_events(self, events: Sequence[Event], received_at: float) -> int: ...

    @abc.abstractmethod
    def telemetry(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None
    ) -> list[TelemetryPoint]:
        """Raw reports of one device in [since, until), oldest first."""

    @abc.abstractmethod
    def latest_telemetry(self) -> dict[str, TelemetryPoint]: ...

    @abc.abstractmethod
    def series(self, device_id: str, since: float, until: float, step: float) -> list[SeriesPoint]:
        """The device's history averaged per `step` seconds, from raw reports and downsampled buckets."""

    @abc.abstractmethod
    def events(
        self, device_id: str | None = None, since: float = 0.0, bundle_id: str | None = None, limit: int = 1000,
        received_since: float | None = None,
    ) -> list[EventRecord]:  # fmt: skip
        """Events oldest first (the newest `limit` of them). `since` is on the devices' clocks,
        `received_since` on the control plane's (immune to a device whose clock is off)."""

    @abc.abstractmethod
    def telemetry_count(self, device_id: str | None = None) -> int: ...

    # --- model quality (stored by `add_telemetry` with each report that carries any)
    @abc.abstractmethod
    def quality(
        self, device_id: str, since: float, until: float | None = None, bundle_id: str | None = None
    ) -> list[QualityPoint]:
        """Quality figures of one device's reports in [since, until), oldest first."""

    @abc.abstractmethod
    def latest_quality(self) -> dict[str, QualityPoint]:
        """Each device's latest report that carried quality figures."""

    @abc.abstractmethod
    def alerts(self, device_id: str | None = None, since: float = 0.0, limit: int = 1000) -> list[AlertRecord]:
        """Drift-band and golden-check crossings, oldest first (the newest `limit`); `since` on device clocks."""

    @abc.abstractmethod
    def compact(
        self,
        now: float,
        *,
        raw_retention_s: float,
        bucket_s: float,
        rollup_retention_s: float,
        event_retention_s: float,
    ) -> Compaction:
        """Downsample raw reports older than `raw_retention_s` into `bucket_s` buckets, drop what is too old."""

    # --- groups and desired state
    @abc.abstractmethod
    def put_group(self, group: GroupDef) -> None: ...

    @abc.abstractmethod
    def delete_group(self, name: str) -> bool: ...

    @abc.abstractmethod
    def groups(self) -> dict[str, GroupDef]: ...

    @abc.abstractmethod
    def put_deployment(self, deployment: Deployment) -> None: ...

    @abc.abstractmethod
    def delete_deployment(self, scope: Scope, target: str, profile: str | None = None) -> int: ...

    @abc.abstractmethod
    def deployments(self) -> list[Deployment]: ...

    @abc.abstractmethod
    def published(self) -> dict[str, PublishedDesired]: ...

    @abc.abstractmethod
    def set_published(self, device_id: str, published: PublishedDesired | None) -> None: ...

    def set_published_many(self, records: Sequence[tuple[str, PublishedDesired | None]]) -> None:
        """`set_published` for many devices; the SQL stores do it in one transaction."""
        for device_id, published in records:
            self.set_published(device_id, published)

    @abc.abstractmethod
    def put_bundle(self, bundle: BundleRecord) -> None: ...

    @abc.abstractmethod
    def bundle(self, bundle_id: str) -> BundleRecord | None: ...

    # --- rollouts
    @abc.abstractmethod
    def save_rollout(self, row: RolloutRow) -> None:
        """Insert or update a rollout's state and document (never its pending command)."""

    @abc.abstractmethod
    def rollouts(self, states: Iterable[str] | None = None) -> list[RolloutRow]: ...

    @abc.abstractmethod
    def rollout(self, rollout_id: str) -> RolloutRow | None: ...

    @abc.abstractmethod
    def set_command(self, rollout_id: str, command: str) -> None:
        """Ask the engine to pause, resume or abort (it takes the command on its next tick)."""

    @abc.abstractmethod
    def take_command(self, rollout_id: str) -> str | None:
        """The pending command, cleared atomically."""

    # --- coordination between control-plane processes
    @abc.abstractmethod
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        """Take or renew a lease; the term's fencing token (>= 1) when `holder` holds it until now + ttl_s, else None.

        The token is the same for every renewal and grows whenever the lease changes hands (a release keeps it)."""

    @abc.abstractmethod
    def release_lease(self, name: str, holder: str) -> None: ...

    @abc.abstractmethod
    def lease(self, name: str) -> tuple[str, float] | None:
        """(holder, expires_at) of a lease, or None (never taken, or released)."""

    @abc.abstractmethod
    def with_fence(self, fence: Fence) -> Store:
        """This store, sharing its connections, whose rollout-state writes (rollouts, deployments, published
        desired state) each check in their transaction that `fence` is still the lease's current term, and raise
        FencedOut (writing nothing) when it is not. Closing it closes nothing."""

    @abc.abstractmethod
    def add_counters(self, deltas: Mapping[str, int]) -> None: ...

    @abc.abstractmethod
    def counters(self) -> dict[str, int]: ...
