"""Simulated agents: real MQTT clients speaking the agent's protocol, hundreds per process on one thread.

Each simulated device is its own paho client (own connection, client id and last will) driven by one
`selectors` loop (`loop_read`/`loop_write`/`loop_misc`, no thread per client). A device publishes its
retained `DeviceStatus` (online; the will says offline), then a `Telemetry` report every interval and
`Event`s on installs, all QoS 1 with the per-device `seq` the agent uses. It follows its retained desired
topic like the agent does: fetch the signed offer, refuse another profile or a version that is not newer
(unless the Desired is a rollback), fetch the retained blocks through a window of subscriptions, check
each block's sha256 against the offer, then report downloaded/installed/committed and the new status.

What is simulated: inference (latency and golden agreement come from `Behavior`, per bundle), the
signature check (the simulator holds no keys) and the disk (blocks are hashed, not written).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import json
import logging
import queue
import random
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edgefleet.core.manifest import parse_version
from edgefleet.core.messages import (
    BundleOffer,
    Desired,
    DeviceState,
    DeviceStatus,
    Event,
    EventKind,
    Hardware,
    LatencySummary,
    MessageError,
    Telemetry,
    decode,
)
from edgefleet.core.mqtt import BrokerAddress
from edgefleet.core.signing import SigningKey
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0-sim"


@dataclass(frozen=True)
class BundleBehavior:
    latency_factor: float = 1.0
    golden_agreement: float = 1.0
    error_rate: float = 0.0
    refuse: str | None = None


@dataclass
class Behavior:
    """How simulated inference behaves; `bundles` overrides it per bundle id (a slow or inaccurate build)."""

    latency_ms: float = 0.25
    requests_per_s: float = 20.0
    error_rate: float = 0.0
    bundles: dict[str, BundleBehavior] = field(default_factory=dict)


@dataclass
class _Download:
    desired: Desired
    offer: BundleOffer | None = None
    model: str = ""
    requested: set[int] = field(default_factory=set)
    next_missing: int = 0
    held: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class SimStats:
    telemetry_sent: int = 0
    telemetry_acked: int = 0
    events_sent: int = 0
    events_acked: int = 0
    connects: int = 0
    disconnects: int = 0
    installs: int = 0
    refusals: int = 0
    block_bytes: int = 0
    corrupt_blocks: int = 0
    raw_bytes: int = 0
    raw_messages: int = 0
    raw_last: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class SimDevice:
    def __init__(self, fleet: SimFleet, device_id: str, profile: str, groups: Sequence[str]) -> None:
        self.fleet, self.device_id, self.profile, self.groups = fleet, device_id, profile, list(groups)
        self.topics = fleet.topics
        self.seq = 0
        self.state: DeviceState = "idle"
        self.active_bundle: str | None = None
        self.active_model: str | None = None
        self.versions: dict[str, str] = {}
        self.installed_at = 0.0
        self.served = 0
        self.download: _Download | None = None
        self.connected = False
        self.pending_acks: dict[int, tuple[str, int]] = {}
        self.acked_telemetry: list[int] = []  # seqs of reports the broker acknowledged
        self.client = self._client()

    def _client(self) -> paho.Client:
        fleet = self.fleet
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"edgefleet-sim-{self.device_id}",
                             protocol=fleet.protocol)  # fmt: skip
        offline = DeviceStatus(device_id=self.device_id, online=False, state="offline", agent_version=AGENT_VERSION,
                               profile=self.profile, groups=self.groups)  # fmt: skip
        client.will_set(self.topics.status(self.device_id), offline.encode(), qos=1, retain=True)
        client.max_inflight_messages_set(64)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_socket_open = fleet._socket_open
        client.on_socket_close = fleet._socket_close
        client.on_socket_register_write = fleet._want_write
        client.on_socket_unregister_write = fleet._done_writing
        client.user_data_set(self)
        return client

    # --- paho callbacks (the loop thread)
    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.warning("sim %s refused: %s", self.device_id, reason)
            return
        self.connected = True
        self.fleet.stats.connects += 1
        self.publish_status()
        client.subscribe(self.topics.device_desired(self.device_id), 1)
        for group in self.groups:
            client.subscribe(self.topics.group_desired(group), 1)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connected = False
        self.fleet.stats.disconnects += 1
        if not self.fleet.stopping:
            self.fleet.schedule(time.monotonic() + 1.0 + random.random(), self._reconnect)

    def _reconnect(self) -> None:
        if self.connected or self.fleet.stopping:
            return
        try:
            self.client.reconnect()
        except OSError:
            self.fleet.schedule(time.monotonic() + 2.0, self._reconnect)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        kind, seq = self.pending_acks.pop(mid, ("", 0))
        if kind == "telemetry":
            self.fleet.stats.telemetry_acked += 1
            self.acked_telemetry.append(seq)
        elif kind == "event":
            self.fleet.stats.events_acked += 1

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        topic, payload = message.topic, bytes(message.payload)
        try:
            if "/blocks/" in topic:
                self._on_block(topic, payload)
            elif topic.endswith("/manifest"):
                self._on_offer(payload)
            elif topic.endswith("/desired"):
                self._on_desired(topic, payload)
            elif topic.startswith(self.fleet.raw_prefix):
                stats = self.fleet.stats
                stats.raw_bytes += len(payload)
                stats.raw_messages += 1
                stats.raw_last = time.time()
        except MessageError as err:
            self.event("refused", f"message on {topic}: {err}")

    # --- reporting
    def publish(self, topic: str, payload: bytes, kind: str, retain: bool = False, seq: int = 0) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        self.pending_acks[info.mid] = (kind, seq)

    def publish_status(self) -> None:
        status = DeviceStatus(
            device_id=self.device_id, online=True, state=self.state, agent_version=AGENT_VERSION,
            profile=self.profile, groups=self.groups, hardware=self.fleet.hardware,
            providers=["CPUExecutionProvider"], active_bundle=self.active_bundle, active_model=self.active_model,
            provider_in_use="CPUExecutionProvider" if self.active_bundle else None,
            verified=self.active_bundle is not None,
        )  # fmt: skip
        self.publish(self.topics.status(self.device_id), status.encode(), "status", retain=True)

    def event(self, kind: EventKind, detail: str, bundle_id: str | None = None, progress: float | None = None) -> None:
        self.seq += 1
        message = Event(device_id=self.device_id, kind=kind, seq=self.seq, bundle_id=bundle_id, detail=detail,
                        progress=progress)  # fmt: skip
        self.fleet.stats.events_sent += 1
        self.publish(self.topics.events(self.device_id), message.encode(), "event")

    def telemetry(self, interval: float) -> None:
        if not self.connected or self.fleet.quiet:
            return
        behavior = self.fleet.behavior
        bundle = behavior.bundles.get(self.active_bundle or "", BundleBehavior())
        requests = int(behavior.requests_per_s * interval) if self.active_bundle else 0
        error_rate = max(behavior.error_rate, bundle.error_rate)
        errors = round(requests * error_rate)
        self.served += requests + errors
        jitter = 1.0 + (random.random() - 0.5) * 0.1
        p50 = behavior.latency_ms * bundle.latency_factor * jitter
        has_latency = self.active_bundle is not None and self.served > 0
        self.seq += 1
        report = Telemetry(
            device_id=self.device_id, seq=self.seq, bundle_id=self.active_bundle,
            provider="CPUExecutionProvider" if self.active_bundle else None, window_s=interval,
            requests=requests, errors=errors, throughput_rps=round(requests / interval, 3),
            latency=LatencySummary(
                count=min(4096, self.served) if has_latency else 0, p50_ms=round(p50, 4) if has_latency else None,
                p95_ms=round(p50 * 1.6, 4) if has_latency else None,
                p99_ms=round(p50 * 2.2, 4) if has_latency else None,
            ),
            golden_agreement=bundle.golden_agreement if self.active_bundle else None,
            golden_max_abs_error=0.0 if self.active_bundle else None, cpu_percent=1.0, rss_mb=60.0,
        )  # fmt: skip
        self.fleet.stats.telemetry_sent += 1
        self.publish(self.topics.telemetry(self.device_id), report.encode(), "telemetry", seq=self.seq)

    # --- installing
    def _on_desired(self, topic: str, payload: bytes) -> None:
        if not payload:
            return
        desired = decode(Desired, payload)
        is_device_topic = topic == self.topics.device_desired(self.device_id)
        self.fleet.desired[(self.device_id, is_device_topic)] = desired
        if not is_device_topic and (self.device_id, True) in self.fleet.desired:
            return  # the device's own desired topic wins over its groups'
        if desired.bundle_id == self.active_bundle or (self.download and self.download.desired == desired):
            return
        self._abandon_download()
        self.event("desired", f"{desired.model_name} {desired.model_version} ({desired.bundle_id})", desired.bundle_id)
        self.client.subscribe(self.topics.bundle_offer(desired.bundle_id), 1)
        self.download = _Download(desired)

    def _on_offer(self, payload: bytes) -> None:
        download = self.download
        if download is None or download.offer is not None:
            return
        offer = decode(BundleOffer, payload)
        if offer.bundle_id != download.desired.bundle_id:
            return
        self.client.unsubscribe(self.topics.bundle_offer(offer.bundle_id))
        manifest = json.loads(offer.manifest_json)
        name, version = manifest["model_name"], manifest["model_version"]
        refusal = self.fleet.behavior.bundles.get(offer.bundle_id, BundleBehavior()).refuse
        running = self.versions.get(name)
        if manifest["profile"] != self.profile:
            refusal = f"bundle is built for profile {manifest['profile']}; this device is {self.profile}"
        elif running and parse_version(version) <= parse_version(running) and not download.desired.rollback:
            refusal = f"{name} version {version} is not newer than {running} (a rollback must be marked by the host)"
        if refusal:
            self.download = None
            self.fleet.stats.refusals += 1
            self.event("rolled-back" if self.active_bundle else "refused", refusal, offer.bundle_id)
            return
        download.offer, download.model = offer, f"{name}@{version}"
        self.event("verified", f"{name} {version} for {self.profile} (signature not checked: simulated)",
                   offer.bundle_id)  # fmt: skip
        self.event("download-started", f"{offer.transfer.size} bytes", offer.bundle_id, 0.0)
        self.state = "downloading"
        self.publish_status()
        self._request_blocks()

    def _request_blocks(self) -> None:
        download = self.download
        assert download is not None and download.offer is not None
        total = download.offer.transfer.block_count
        while len(download.requested) < self.fleet.block_window and download.next_missing < total:
            index = download.next_missing
            download.next_missing += 1
            download.requested.add(index)
            self.client.subscribe(self.topics.bundle_block(download.offer.bundle_id, index), 1)

    def _on_block(self, topic: str, payload: bytes) -> None:
        download = self.download
        index = self.topics.block_index_of(topic)
        if download is None or download.offer is None or index is None or index not in download.requested:
            return
        if topic != self.topics.bundle_block(download.offer.bundle_id, index):
            return
        self.fleet.stats.block_bytes += len(payload)
        self.client.unsubscribe(topic)
        download.requested.discard(index)
        if hashlib.sha256(payload).hexdigest() != download.offer.transfer.block_sha256[index]:
            self.fleet.stats.corrupt_blocks += 1
            download.requested.add(index)
            self.client.subscribe(topic, 1)
            return
        download.held += 1
        if download.held < download.offer.transfer.block_count:
            self._request_blocks()
            return
        self._commit(download)

    def _commit(self, download: _Download) -> None:
        assert download.offer is not None
        bundle_id = download.offer.bundle_id
        self.download = None
        self.event("downloaded", f"{download.offer.transfer.size} bytes, block hashes ok", bundle_id, 1.0)
        self.event("installed", "simulated golden set passed", bundle_id)
        previous = self.active_bundle
        name, _, version = download.model.rpartition("@")
        self.active_bundle, self.active_model = bundle_id, download.model
        self.versions[name] = version
        self.served = 0
        self.state = "serving"
        self.fleet.stats.installs += 1
        self.fleet.commits.append((self.device_id, bundle_id, time.time()))
        self.publish_status()
        self.event("committed", "now serving (simulated)" + (f" (was {previous})" if previous else ""), bundle_id)

    def _abandon_download(self) -> None:
        download, self.download = self.download, None
        if download is None:
            return
        if download.offer is None:
            self.client.unsubscribe(self.topics.bundle_offer(download.desired.bundle_id))
            return
        for index in download.requested:
            self.client.unsubscribe(self.topics.bundle_block(download.offer.bundle_id, index))


class SimFleet:
    """N simulated devices on one thread. Start, let it run, read `stats`, stop."""

    def __init__(
        self,
        broker: str,
        device_ids: Sequence[str],
        *,
        profile: str = "generic-x86-64",
        groups: Sequence[str] = (),
        prefix: str = "edgefleet/v1",
        telemetry_interval: float = 1.0,
        protocol: str = "3.1.1",
        behavior: Behavior | None = None,
        block_window: int = 16,
        connect_per_tick: int = 50,
    ) -> None:
        self.address = BrokerAddress.parse(broker)
        self.topics = Topics(prefix)
        self.protocol = paho.MQTTv5 if protocol == "5" else paho.MQTTv311
        self.telemetry_interval = telemetry_interval
        self.behavior = behavior or Behavior()
        self.block_window = block_window
        self.connect_per_tick = connect_per_tick
        self.raw_prefix = "bench/raw/"
        self.hardware = Hardware(arch="x86_64", os="linux", cpu_count=4, memory_mb=4096, hostname=socket.gethostname())
        self.stats = SimStats()
        self.desired: dict[tuple[str, bool], Desired] = {}
        self.commits: list[tuple[str, str, float]] = []
        self.stopping = False
        self.quiet = False  # no more telemetry (stopping: waiting for the last acknowledgements)
        self._selector = selectors.DefaultSelector()
        self._writers: set[paho.Client] = set()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]] = queue.SimpleQueue()
        self.devices = {d: SimDevice(self, d, profile, groups) for d in device_ids}
        self._to_connect = list(self.devices.values())
        self._thread = threading.Thread(target=self._loop, name="sim-fleet", daemon=True)
        self._stopped = threading.Event()

    # --- control from other threads
    def start(self) -> SimFleet:
        self._thread.start()
        return self

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the loop thread (paho clients are not thread-safe) and return its result."""
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._calls.put((fn, box))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def wait_connected(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(d.connected for d in self.devices.values()):
                return True
            time.sleep(0.05)
        return False

    def snapshot(self) -> dict[str, Any]:
        return dict(self.call(self.stats.as_dict))

    def kill(self, device_id: str) -> None:
        """Drop a device's connection without DISCONNECT: the broker publishes its last will."""

        def drop() -> None:
            device = self.devices.pop(device_id)
            device.connected = False
            sock = device.client.socket()
            if sock is not None:
                self._forget(sock)
                sock.close()

        self.call(drop)

    def raw_subscribe(self, tag: str, device_ids: Sequence[str] | None = None) -> None:
        """Subscribe devices to a plain topic whose bytes are only counted (a raw bandwidth baseline)."""

        def sub() -> None:
            for device_id in device_ids if device_ids is not None else list(self.devices):
                if device_id in self.devices:
                    self.devices[device_id].client.subscribe(self.raw_prefix + tag, 1)

        self.call(sub)

    def in_flight(self) -> int:
        return int(self.call(lambda: sum(len(d.pending_acks) for d in self.devices.values())))

    def acked_telemetry(self) -> dict[str, list[int]]:
        """device id → seqs of the reports the broker acknowledged (what must reach the store)."""
        return dict(self.call(lambda: {d.device_id: list(d.acked_telemetry) for d in self.devices.values()}))

    def stop(self, graceful: bool = True, drain_s: float = 5.0) -> None:
        """Stop sending telemetry, wait for the broker to acknowledge what is in flight, then disconnect
        (graceful: with an offline status first; otherwise the last will says it)."""
        if not self._thread.is_alive():
            return
        self.call(lambda: setattr(self, "quiet", True))
        deadline = time.monotonic() + drain_s
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)

        def halt() -> None:
            self.stopping = True
            for device in self.devices.values():
                if graceful and device.connected:
                    status = DeviceStatus(
                        device_id=device.device_id, online=False, state="offline", agent_version=AGENT_VERSION,
                        profile=device.profile, groups=device.groups,
                    )  # fmt: skip
                    device.publish(self.topics.status(device.device_id), status.encode(), "status", retain=True)
                    device.client.disconnect()

        if self._thread.is_alive():
            self.call(halt)
            self._stopped.wait(10)

    # --- the loop
    def schedule(self, due: float, fn: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (due, self._timer_seq, fn))

    def _socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._forget(sock)
        self._writers.discard(client)

    def _forget(self, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _want_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._writers.add(client)

    def _done_writing(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._writers.discard(client)

    def _connect_some(self) -> None:
        for _ in range(min(self.connect_per_tick, len(self._to_connect))):
            device = self._to_connect.pop(0)
            try:
                device.client.connect(self.address.host, self.address.port, keepalive=60)
            except OSError as err:
                log.warning("sim %s cannot connect: %s; retrying", device.device_id, err)
                self.schedule(time.monotonic() + 1.0, functools.partial(self._to_connect.append, device))
                continue
            phase = random.random() * self.telemetry_interval
            self.schedule(time.monotonic() + self.telemetry_interval + phase, functools.partial(self._tick, device))

    def _tick(self, device: SimDevice) -> None:
        if self.stopping or device.device_id not in self.devices:
            return
        device.telemetry(self.telemetry_interval)
        self.schedule(time.monotonic() + self.telemetry_interval, functools.partial(self._tick, device))

    def _loop(self) -> None:
        last_misc = time.monotonic()
        stop_at: float | None = None
        try:
            while True:
                while not self._calls.empty():
                    fn, box = self._calls.get()
                    try:
                        box.put((True, fn()))
                    except Exception as err:
                        box.put((False, err))
                if self.stopping and stop_at is None:
                    stop_at = time.monotonic() + 2.0
                if stop_at is not None and (time.monotonic() > stop_at or not self._selector.get_map()):
                    break
                if self._to_connect and not self.stopping:
                    self._connect_some()
                for client in list(self._writers):
                    client.loop_write()
                for key, _ in self._selector.select(timeout=0.01):
                    key.data.loop_read()
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self._timers)
                    fn()
                if now - last_misc >= 1.0:
                    last_misc = now
                    for device in list(self.devices.values()):
                        device.client.loop_misc()
        except Exception:
            log.exception("simulated fleet loop failed")
        finally:
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()
            self._stopped.set()


def synthetic_bundle(
    out_dir: Path,
    key: SigningKey,
    *,
    model_name: str = "sim-model",
    version: str = "1",
    profile: str = "generic-x86-64",
    size_bytes: int = 64 * 1024,
    seed: int = 0,
    accuracy_budget: float = 0.01,
) -> Path:
    """A signed bundle whose model file is `size_bytes` of random bytes: for simulated devices only (they
    check the transfer, not the model), so benchmarks and tests need no converter."""
    import numpy as np

    from edgefleet.core.bundle import describe_files, pack_bundle
    from edgefleet.core.manifest import AccuracyReport, GoldenSpec, Manifest, Recipe, TensorSpec

    work = out_dir / f"src-{model_name}-{version}-{profile}"
    (work / "model").mkdir(parents=True, exist_ok=True)
    model = work / "model" / "model.onnx"
    model.write_bytes(np.random.default_rng(seed).bytes(size_bytes))
    sources = {"model/model.onnx": model}
    manifest = Manifest(
        bundle_id=f"{model_name}-{version}-{profile}",
        model_name=model_name,
        model_version=version,
        profile=profile,
        format="onnx",
        model_path="model/model.onnx",
        recipe=Recipe(name="fp32", precision="fp32", runtime="onnxruntime"),
        providers=["CPUExecutionProvider"],
        opset={"": 17},
        inputs=[TensorSpec(name="input", dtype="float32", shape=[1, 4])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[1, 2])],
        files=describe_files(sources),
        accuracy=AccuracyReport(
            metric="top1", value=0.99, reference=0.99, budget=accuracy_budget, samples=100, passed=True
        ),
        golden=GoldenSpec(count=1, max_abs_error=1e-3, min_agreement=1.0),
        source_sha256=hashlib.sha256(model.read_bytes()).hexdigest(),
    )
    path = out_dir / f"{manifest.bundle_id}.bundle"
    pack_bundle(path, manifest, sources, key)
    return path


__all__ = ["Behavior", "BundleBehavior", "SimFleet", "synthetic_bundle"]
