"""A script holding one device's certificate (an attacker who took a device): it speaks the agent's protocol on its
own topics, status, telemetry and events, and says whatever it is told to, doing none of an agent's work.

`LyingDevice.claims` is what it reports in its status and every telemetry report (sent every `interval` seconds
from its own thread); `on_desired` is called with each desired document the host publishes to it (the signature
is not checked: the liar only reads what it was asked to run). It can read what its broker rights allow: its own
desired topic, and the offer of the bundle it was deployed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from edgefleet.control.desired.signing import unverified_desired
from edgefleet.core.messages import (
    BundleOffer,
    Desired,
    DeviceStatus,
    Event,
    EventKind,
    LatencySummary,
    LinkReport,
    OutputScore,
    SlotStatus,
    Telemetry,
    decode,
)
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import DEFAULT_SLOT, Topics

from support.servers.secure_broker import SecureBroker


@dataclass(frozen=True)
class Claims:
    """What the liar says about itself."""

    profile: str = "intel-x86-vnni"
    groups: tuple[str, ...] = ()
    active_bundle: str | None = None
    verified: bool = False
    p50_ms: float = 0.5
    p95_ms: float = 0.6
    requests: int = 50  # per report
    golden: float | None = 1.0
    golden_scores: tuple[OutputScore, ...] = ()
    bulk_bytes: int = 0  # its "link counters"


@dataclass
class LyingDevice:
    broker: SecureBroker
    device_id: str
    claims: Claims = field(default_factory=Claims)
    interval: float = 0.5
    on_desired: Callable[[LyingDevice, Desired], None] | None = None
    topics: Topics = field(default_factory=Topics)

    def __post_init__(self) -> None:
        self.seq = 0
        self.desired: list[Desired] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.conn: Connection | None = None
        self._thread = threading.Thread(target=self._loop, name=f"liar-{self.device_id}", daemon=True)

    def start(self) -> LyingDevice:
        if self.conn is not None:
            return self  # already started (`with` on a started device)
        self.conn = self.broker.connect(self.device_id, client_id=self.device_id)
        self.conn.subscribe(self.topics.device_desired(self.device_id, DEFAULT_SLOT), self._on_desired, qos=1)
        self.status()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.conn is not None:
            self.conn.stop()

    def __enter__(self) -> LyingDevice:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def say(self, **changes: object) -> None:
        """Change what it claims, and publish its status at once."""
        with self._lock:
            self.claims = replace(self.claims, **changes)  # type: ignore[arg-type]
        self.status()

    # --- what it publishes
    def _next(self) -> int:
        with self._lock:
            self.seq += 1
            return self.seq

    def status(self) -> None:
        c = self.claims
        message = DeviceStatus(
            device_id=self.device_id, online=True, state="serving" if c.active_bundle else "idle",
            agent_version="0.1.0", profile=c.profile, groups=list(c.groups), providers=["CPUExecutionProvider"],
            slots=[SlotStatus(
                slot=DEFAULT_SLOT, state="serving" if c.active_bundle else "idle", active_bundle=c.active_bundle,
                active_model=f"{c.active_bundle}@1" if c.active_bundle else None,
                provider_in_use="CPUExecutionProvider" if c.active_bundle else None, verified=c.verified,
            )],
        )  # fmt: skip
        assert self.conn is not None
        self.conn.publish(self.topics.status(self.device_id), message.encode(), qos=1, retain=True)

    def event(self, kind: EventKind, bundle_id: str | None, detail: str = "") -> None:
        message = Event(device_id=self.device_id, kind=kind, seq=self._next(), bundle_id=bundle_id, detail=detail)
        assert self.conn is not None
        self.conn.publish(self.topics.events(self.device_id), message.encode(), qos=1)

    def telemetry(self) -> None:
        c = self.claims
        running = c.active_bundle is not None
        message = Telemetry(
            device_id=self.device_id, seq=self._next(), bundle_id=c.active_bundle,
            provider="CPUExecutionProvider" if running else None, window_s=self.interval,
            requests=c.requests if running else 0, errors=0, throughput_rps=c.requests / self.interval,
            latency=LatencySummary(count=1000 if running else 0, p50_ms=c.p50_ms if running else None,
                                   p95_ms=c.p95_ms if running else None, p99_ms=c.p95_ms if running else None),
            golden_agreement=c.golden if running else None, golden_max_abs_error=0.0 if running else None,
            cpu_percent=1.0, rss_mb=50.0, golden_scores=list(c.golden_scores) if running else [],
            link=LinkReport(bulk_bytes=c.bulk_bytes, clock_s=round(time.monotonic(), 4)),
        )  # fmt: skip
        assert self.conn is not None
        self.conn.publish(self.topics.telemetry(self.device_id), message.encode(), qos=1)

    def offer(self, bundle_id: str, timeout: float = 10.0) -> BundleOffer | None:
        """The signed offer of a bundle, if its rights let it read it."""
        got: list[BundleOffer] = []
        done = threading.Event()

        def on_offer(topic: str, payload: bytes, retained: bool) -> None:
            if payload:
                got.append(decode(BundleOffer, payload))
                done.set()

        assert self.conn is not None
        topic = self.topics.bundle_offer(bundle_id)
        self.conn.subscribe(topic, on_offer, qos=1)
        done.wait(timeout)
        self.conn.unsubscribe(topic)
        return got[0] if got else None

    def output_names(self, bundle_id: str) -> list[str]:
        offer = self.offer(bundle_id)
        return [o["name"] for o in json.loads(offer.manifest_json)["outputs"]] if offer else []

    # --- the loop
    def _on_desired(self, topic: str, payload: bytes, retained: bool) -> None:
        if not payload:
            return
        desired = unverified_desired(payload)
        self.desired.append(desired)
        if self.on_desired is not None and not desired.clear:
            threading.Thread(target=self.on_desired, args=(self, desired), daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.telemetry()
            except Exception:  # a test helper: a failed publish is the test's problem, not a crash of the thread
                time.sleep(self.interval)


__all__ = ["Claims", "LyingDevice"]
