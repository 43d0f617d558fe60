"""`edgefleet control serve`: ingestion, the rollout engine, desired-state sync, compaction and the dashboard.

The engine's loops (the rollout engine, the desired-state sync, the broker-rights sync) each keep a `LoopHealth`
that this instance writes to the store (edgefleet/control/health.py): `edgefleet control status`, the dashboard
and `/metrics` of any instance show when one fails or stalls.

Several processes may run against one broker and one store: each ingests its share of telemetry and
events (shared subscriptions); the one holding the engine lease runs rollouts and publishes desired
state, through a store view fenced by its lease term (`leadership`); a process that dies loses the lease
within `lease_ttl_s` and another takes over within `lease_ttl_s + tick_s`, reading the rollouts where the
store left them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from edgefleet.control.broker.janitor import RetainedJanitor
from edgefleet.control.dashboard.auth import trusted_proxies
from edgefleet.control.dashboard.server import DashboardServer
from edgefleet.control.desired.legacy import migrate_legacy_desired
from edgefleet.control.desired.sync import DesiredPublisher
from edgefleet.control.fleet.ingest import INGEST_IN_FLIGHT, Ingestor
from edgefleet.control.health import (
    COMPACTION,
    DESIRED_SYNC,
    ENGINE,
    INGEST,
    INGEST_INTERVAL_S,
    QUOTA,
    RETENTION,
    RIGHTS_SYNC,
    HealthBoard,
    LoopHealth,
)
from edgefleet.control.leadership import Leadership
from edgefleet.control.rights.sync import RightsMode, open_rights
from edgefleet.control.rollout.engine import ENGINE_LEASE, RolloutEngine
from edgefleet.control.store import AlertRecord, Fence, FencedOut, QuotaCut, Store, open_store
from edgefleet.core.errors import BrokerError, EdgefleetError
from edgefleet.core.mqtt.connection import Connection, Protocol, TlsFiles
from edgefleet.core.topics import DEFAULT_PREFIX, Topics
from edgefleet.core.untrusted import safe_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlConfig:
    broker: str
    store_url: str
    prefix: str = DEFAULT_PREFIX
    protocol: Protocol = "auto"
    tls: TlsFiles | None = None
    instance: str = "main"
    share_group: str | None = "edgefleet"
    ingest: bool = True
    engine: bool = True
    http_host: str = "127.0.0.1"
    http_port: int | None = 8780
    http_tls: tuple[str, str] | None = None  # the dashboard's certificate and key: HTTPS
    trusted_proxies: tuple[str, ...] = ()  # whose X-Forwarded-For the dashboard believes (--trusted-proxy)
    tick_s: float = 1.0
    sync_every_s: float = 5.0
    lease_ttl_s: float = 10.0
    session_expiry_s: int = 600
    compact_every_s: float = 60.0
    raw_retention_s: float = 6 * 3600.0
    bucket_s: float = 60.0
    rollup_retention_s: float = 30 * 86400.0
    event_retention_s: float = 30 * 86400.0
    device_store_bytes: int = 256 * 2**20  # retention by bytes: what one device may hold in the store (0: no cap)
    quota_every_s: float = 600.0  # how often the devices' bytes are measured (store/quota.py)
    broker_rights: RightsMode = "auto"  # see edgefleet.control.rights.sync
    retained_sweep_s: float = 10.0  # clear retained messages devices leave outside their status (0: never)


class ControlPlane:
    def __init__(self, config: ControlConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store or open_store(config.store_url)
        self.topics = Topics(config.prefix)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{config.instance}"
        self.conn = Connection(
            config.broker,
            f"edgefleet-control-{config.instance}",
            protocol=config.protocol,
            tls=config.tls,
            session_expiry_s=config.session_expiry_s,
            manual_ack=config.ingest,  # ingestion acknowledges a message once it is stored
            receive_maximum=INGEST_IN_FLIGHT,
        )
        self.ingestor: Ingestor | None = None
        self.publisher = DesiredPublisher(self.conn, self.topics, self.store)
        now = time.time()
        self.loops = {
            ENGINE: LoopHealth(ENGINE, config.tick_s, active=False, now=now),
            DESIRED_SYNC: LoopHealth(DESIRED_SYNC, config.sync_every_s, active=False, now=now),
            RIGHTS_SYNC: LoopHealth(RIGHTS_SYNC, config.sync_every_s, active=False, now=now),
            INGEST: LoopHealth(INGEST, INGEST_INTERVAL_S, now=now),
            COMPACTION: LoopHealth(COMPACTION, config.compact_every_s, now=now),
            RETENTION: LoopHealth(RETENTION, config.compact_every_s, now=now),
            QUOTA: LoopHealth(QUOTA, config.quota_every_s, now=now),
        }
        self.publisher.rights_health = self.loops[RIGHTS_SYNC]
        self.engine = RolloutEngine(self.store, self.publisher, health=self.loops[ENGINE])
        self.health: HealthBoard | None = None
        self.dashboard: DashboardServer | None = None
        self.leadership = Leadership(self.store, ENGINE_LEASE, self.holder, config.lease_ttl_s)
        self._stop = threading.Event()
        self._stopped = False
        self._legacy_moved = False  # the retained single-model desired documents were moved to per-slot topics
        self._legacy_retry_at = 0.0
        self._threads: list[threading.Thread] = []

    @property
    def dashboard_url(self) -> str | None:
        return self.dashboard.url if self.dashboard else None

    def start(self, wait: float = 10.0) -> ControlPlane:
        if self.config.ingest:
            self.ingestor = Ingestor(self.conn, self.topics, self.store, share_group=self.config.share_group,
                                     health=self.loops[INGEST])  # fmt: skip
            self.ingestor.start()  # subscriptions are made on connect
        self.conn.start(wait=wait)
        if self.ingestor is not None:
            self.ingestor.check_shared()
        self.publisher.rights = open_rights(self.conn, self.topics, self.config.broker_rights)
        if self.config.http_port is not None:
            self.dashboard = DashboardServer(
                self.store,
                self.config.http_host,
                self.config.http_port,
                self.config.http_tls,
                local_metrics=self.local_metrics,
                trusted_proxies=trusted_proxies(self.config.trusted_proxies),
            ).start()
            log.info("dashboard on %s", self.dashboard.url)
        loops = [self.loops[ENGINE], self.loops[DESIRED_SYNC]] if self.config.engine else []
        if self.config.engine and self.publisher.rights.managed:
            loops.append(self.loops[RIGHTS_SYNC])
        if self.ingestor is not None:
            loops.append(self.loops[INGEST])
        steps = self._store_steps()
        loops += [self.loops[name] for name in steps]
        if loops:
            board = self.health = HealthBoard(self.store, self.holder, loops)
            self._spawn("loop-health", lambda: board.run(self._stop))
        if self.config.engine:
            self._spawn("engine-lease", self._lease_loop)
            self._spawn("rollout-engine", self._engine_loop)
        for name, (every_s, step) in steps.items():
            self._spawn(name, lambda name=name, every_s=every_s, step=step: self._periodic(name, every_s, step))
        return self

    def _store_steps(self) -> dict[str, tuple[float, Callable[[], None]]]:
        """The store's own loops, run beside ingestion, each in a thread of its own (a failing or slow one never
        skips another): compaction (downsampling), retention by age, and the per-device quota."""
        c = self.config
        if not c.ingest or c.compact_every_s <= 0:
            return {}
        steps: dict[str, tuple[float, Callable[[], None]]] = {
            COMPACTION: (c.compact_every_s, self.compact),
            RETENTION: (c.compact_every_s, self.expire),
        }
        if c.device_store_bytes:
            steps[QUOTA] = (c.quota_every_s, self._quota_step)
        return steps

    def _periodic(self, name: str, every_s: float, step: Callable[[], None]) -> None:
        """Run `step` every `every_s` until stopped; its `LoopHealth` records each success and each error."""
        health = self.loops[name]
        logged: float | None = None
        while not self._stop.wait(every_s):
            try:
                step()
            except Exception as err:  # the loop outlives its step: the next period tries again
                health.failed(time.time(), f"{name}: {err}")
                if logged is None:  # the first failure with its traceback, then a line a minute at most
                    log.exception("%s failed", name)
                    logged = time.monotonic()
                elif time.monotonic() - logged >= 60.0:
                    log.warning("%s still fails: %s", name, safe_text(err, 300))
                    logged = time.monotonic()
            else:
                health.ticked(time.time())
                logged = None

    def _quota_step(self) -> None:
        self.enforce_quota()

    def compact(self) -> None:
        """Downsampling: raw reports past the raw retention summed into buckets."""
        c = self.config
        moved, deleted = self.store.downsample(time.time(), raw_retention_s=c.raw_retention_s, bucket_s=c.bucket_s)
        if moved or deleted:
            log.info("compaction: %d reports downsampled, %d raw rows deleted", moved, deleted)

    def expire(self) -> None:
        """Retention by age: buckets, events, quality rows and install evidence past their windows."""
        c = self.config
        rollups, events = self.store.expire(
            time.time(), raw_retention_s=c.raw_retention_s, bucket_s=c.bucket_s,
            rollup_retention_s=c.rollup_retention_s, event_retention_s=c.event_retention_s,
        )  # fmt: skip
        if rollups or events:
            log.info("retention: %d buckets and %d events deleted", rollups, events)

    def _spawn(self, name: str, target: object) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def stop(self, retire: bool = False) -> None:
        """Stop. The broker keeps this instance's persistent session (`session_expiry_s`) and queues its share
        of telemetry for a restart under the same `instance` name; `retire=True` leaves the shared
        subscriptions first, so the other instances get that share instead. Calling it twice is harmless."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        if self.health is not None:  # a clean stop: this instance's loops are gone, not stalled
            try:
                self.store.repos.health.drop_health(self.holder)
            except Exception as err:  # a store that is away never fails a stop: the rows read "gone" in 10 min
                log.warning("cannot drop this instance's loop health: %s", err)
        if self.leader:
            try:
                self.leadership.release()
            except EdgefleetError as err:
                log.warning("cannot release the engine lease: %s", err)
        if retire and self.ingestor is not None and self.conn.connected:
            self.ingestor.retire()
        self.conn.stop()
        if self.ingestor is not None:
            self.ingestor.stop()
        if self.dashboard is not None:
            self.dashboard.stop()
        self.store.close()

    def local_metrics(self) -> dict[str, float]:
        """This process's own figures for /metrics: ingestion's backlog (what the store does not hold yet)."""
        if self.ingestor is None:
            return {}
        waiting, oldest_s = self.ingestor.backlog()
        return {"ingest_backlog_messages": waiting, "ingest_backlog_oldest_seconds": round(oldest_s, 3)}

    @property
    def leader(self) -> bool:
        return self.leadership.leader

    def request_stop(self) -> None:
        """Make `run_forever` return (safe from a signal handler)."""
        self._stop.set()

    def run_forever(self) -> None:
        while not self._stop.wait(1.0):
            pass

    def _move_legacy_desired(self) -> None:
        """Retained single-model desired documents move to their default slot's topic (desired/legacy.py); a broker
        that does not answer in time is tried again a minute later (the engine goes on meanwhile)."""
        try:
            migrate_legacy_desired(self.conn, self.topics)
        except BrokerError as err:
            log.warning("moving legacy desired documents to the default slot failed (retried in 60 s): %s", err)
            self._legacy_retry_at = time.monotonic() + 60.0
            return
        self._legacy_moved = True

    def _lease_loop(self) -> None:
        """Renew (or take) the engine lease a few times per TTL, whatever the engine thread is doing."""
        every = max(0.05, min(self.config.tick_s, self.config.lease_ttl_s / 4))
        while not self._stop.is_set():
            try:
                self.leadership.renew()
            except Exception:  # a store that is away: the lease lapses if this lasts, and fencing covers that
                log.exception("renewing the rollout engine lease failed")
            self._stop.wait(every)

    def _engine_loop(self) -> None:
        last_sync = last_sweep = 0.0
        janitor = RetainedJanitor(self.conn, self.topics)
        current: Fence | None = None
        engine, desired = self.loops[ENGINE], self.loops[DESIRED_SYNC]
        while not self._stop.is_set():
            fence, fenced = self.leadership.term()
            for name in (ENGINE, DESIRED_SYNC, RIGHTS_SYNC):  # ingest runs on every instance
                self.loops[name].set_active(fence is not None, time.time())
            try:
                if fence is not None and fenced is not None and fence != current:  # a new term: fenced writers
                    rights = self.publisher.rights
                    self.publisher = DesiredPublisher(self.conn, self.topics, fenced)
                    self.publisher.rights, self.publisher.rights_health = rights, self.loops[RIGHTS_SYNC]
                    self.engine = RolloutEngine(fenced, self.publisher, health=engine)
                    last_sync = 0.0
                current = fence
                if fence is not None and self.conn.connected:
                    if time.monotonic() - last_sync >= self.config.sync_every_s:
                        last_sync = time.monotonic()
                        try:
                            self.publisher.sync()
                            desired.ticked(time.time())
                        except FencedOut:
                            raise
                        except Exception as err:  # the rollouts still step; the next sync retries
                            desired.failed(time.time(), f"desired-state sync: {err}")
                            log.exception("desired-state sync failed")
                    self.engine.tick()
                    if not self._legacy_moved and time.monotonic() >= self._legacy_retry_at:  # once, by the leader
                        self._move_legacy_desired()  # after the tick: the first sync and step are not held up
                    managed = self.publisher.rights.managed  # on an open broker a sweep is pointless
                    if managed and 0 < self.config.retained_sweep_s <= time.monotonic() - last_sweep:
                        janitor.sweep()
                        last_sweep = time.monotonic()
            except FencedOut as err:
                self.leadership.step_down(str(err), fence)
            except Exception as err:  # the engine outlives a busy store or a broker hiccup; the next tick retries
                engine.failed(time.time(), f"rollout engine tick: {err}")
                log.exception("rollout engine tick failed")
            self._stop.wait(self.config.tick_s)

    def enforce_quota(self) -> list[QuotaCut]:
        """Retention by bytes: cut each device holding more than `device_store_bytes` back (store/quota.py),
        counted (`ingest.quota_deleted`) and raised as a `device-over-quota` alert per device."""
        cuts = self.store.enforce_device_quota(self.config.device_store_bytes)
        if not cuts:
            return cuts
        now = time.time()
        self.store.add_counters({"ingest.quota_deleted": sum(sum(c.deleted.values()) for c in cuts)})
        alerts = []
        for c in cuts:
            deleted = ", ".join(f"{table} {n}" for table, n in sorted(c.deleted.items()))
            alerts.append(AlertRecord(
                device_id=c.device_id, ts=now, kind="device-over-quota", subject="store", level="warning",
                bundle_id=None, detail=f"held {c.held_bytes} bytes in the store, over its "
                f"{self.config.device_store_bytes}: its oldest rows deleted ({deleted})",
            ))  # fmt: skip
        self.store.add_alerts(alerts, now)
        for c in cuts:
            log.warning("device %s held %d bytes in the store, over its quota: oldest rows deleted %s",
                        safe_text(c.device_id), c.held_bytes, c.deleted)  # fmt: skip
        return cuts

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
