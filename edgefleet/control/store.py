"""The control plane's store behind a URL: devices, telemetry, events, groups, desired state, rollouts.

`open_store("sqlite:///var/lib/edgefleet/control.sqlite")` returns a `Store`. SQLite is the default and
the only backend built here; the interface is what a PostgreSQL backend would implement (the SQL in the
SQLite backend is standard apart from a few upserts), so a fleet that outgrows one machine swaps the URL,
not the code. Every method is safe to call from several threads, and several processes may share one
store: deduplication (`UNIQUE (device_id, seq, ts)`), leases and rollout commands are done in SQL, so
they hold across processes too.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edgefleet.core.errors import UserInputError
from edgefleet.core.messages import DeviceStatus, Event, Telemetry

Scope = Literal["fleet", "group", "device"]
FLEET_TARGET = "*"


class StoreError(UserInputError):
    """The store URL is wrong, or the store cannot be opened."""


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


@dataclass(frozen=True)
class PublishedDesired:
    """What the control plane last published, retained, on a device's desired topic."""

    device_id: str
    bundle_id: str
    rollback: bool
    issued_at: float


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


class Store(abc.ABC):
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
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> bool:
        """Take or renew a lease; True when `holder` holds it until now + ttl_s."""

    @abc.abstractmethod
    def release_lease(self, name: str, holder: str) -> None: ...

    @abc.abstractmethod
    def lease(self, name: str) -> tuple[str, float] | None:
        """(holder, expires_at) of a lease, or None."""

    @abc.abstractmethod
    def add_counters(self, deltas: Mapping[str, int]) -> None: ...

    @abc.abstractmethod
    def counters(self) -> dict[str, int]: ...


Opener = Callable[[str], Store]
_BACKENDS: dict[str, Opener] = {}


def register_backend(scheme: str, opener: Opener) -> None:
    _BACKENDS[scheme] = opener


def _open_sqlite(url: str) -> Store:
    from edgefleet.control.store_sqlite import SqliteStore

    path = url.split("://", 1)[1] if "://" in url else url.removeprefix("sqlite:")
    if not path or path in ("/", ":memory:", "/:memory:"):
        raise StoreError(f"store URL {url!r} names no file; use sqlite:///absolute/path.sqlite")
    return SqliteStore(Path(path), url)


def _postgres_missing(url: str) -> Store:
    raise StoreError(
        "a PostgreSQL store is not built yet: implement edgefleet.control.store.Store for it and register it "
        "with register_backend('postgresql', ...); use sqlite:///PATH meanwhile"
    )


register_backend("sqlite", _open_sqlite)
register_backend("postgresql", _postgres_missing)
register_backend("postgres", _postgres_missing)


def open_store(url: str) -> Store:
    """A store from its URL: `sqlite:///abs/path.sqlite`, `sqlite:relative.sqlite` or a plain file path."""
    if "://" not in url and not url.startswith("sqlite:"):
        return _open_sqlite(f"sqlite://{Path(url).resolve()}")
    scheme = url.split(":", 1)[0].lower()
    opener = _BACKENDS.get(scheme)
    if opener is None:
        raise StoreError(f"unknown store URL scheme {scheme!r} in {url!r}; valid: {', '.join(sorted(_BACKENDS))}")
    return opener(url)
