"""The fleet as the benchmark farm, host side: send candidate bundles to devices of their profile, collect what each
device measured (edgefleet/core/farm_messages.py).

`FleetFarm` is what `edgefleet convert --measure-on DEVICE|GROUP` hands the converter (edgefleet.converter's
`Farm`), and what a control-plane process hands `edgefleet.converter.convert` to do the same: per profile, it picks the
online devices of that name that run the profile (farm_devices.py), publishes the signed benchmark-only candidates,
lets those devices read them on a managed broker (farm_rights.py), asks them, and waits with a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.control.farm.devices import for_profile, merge_status, resolve_target
from edgefleet.control.farm.rights import candidate_rights
from edgefleet.control.rights.sync import BrokerRights, NoBrokerRights
from edgefleet.core.errors import UserInputError
from edgefleet.core.farm_messages import BenchmarkRequest, BenchmarkResult, FarmAnswer
from edgefleet.core.messages import DeviceStatus, MessageError, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

if TYPE_CHECKING:
    from edgefleet.control.server import ControlPlane
    from edgefleet.control.store import DeviceRecord, Store

log = logging.getLogger(__name__)

RESEND_S = 5.0
STATUS_WAIT_S = 10.0  # for the retained statuses of the named devices to arrive after subscribing


@dataclass
class FarmRun:
    """What came back: a result per device that answered in time; the others are listed as silent."""

    results: dict[str, BenchmarkResult] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def measure_on_devices(
    conn: Connection,
    topics: Topics,
    bundle_ids: Sequence[str],
    devices: Sequence[str],
    *,
    timeout_s: float = 300.0,
    cpu_share: float = 0.5,
    calls: int = 50,
    rounds: int = 7,
) -> FarmRun:
    """Ask each device to measure the (already published) candidates; wait for every answer or `timeout_s`."""
    client_id = f"farm-{uuid.uuid4().hex[:12]}"
    request = BenchmarkRequest(
        request_id=client_id, client_id=client_id, bundle_ids=list(bundle_ids), cpu_share=cpu_share,
        rounds=rounds, calls=calls, timeout_s=timeout_s,
    )  # fmt: skip
    run = FarmRun()
    lock, done = threading.Lock(), threading.Event()
    wanted = set(devices)

    def on_result(topic: str, payload: bytes, retained: bool) -> None:
        try:
            result = decode(BenchmarkResult, payload)
        except MessageError as err:
            log.warning("benchmark result on %s ignored: %s", topic, err)
            return
        device = topics.device_id_of(topic)
        if result.request_id != request.request_id or device not in wanted or result.device_id != device:
            return
        with lock:
            run.results[device] = result
            if set(run.results) >= wanted:
                done.set()

    start = time.monotonic()
    subscribed = [topics.benchmark_result(d, client_id) for d in devices]
    for topic in subscribed:
        conn.subscribe(topic, on_result, qos=1)
    try:
        # Requests are not retained (a stale one must not run days later), so a device that was reconnecting when
        # one went out would miss it: re-send to the silent ones until they answer; devices take each id once.
        end = start + timeout_s + 10.0  # the device's own budget, plus the time to answer
        while not done.is_set() and time.monotonic() < end:
            with lock:
                waiting = [d for d in devices if d not in run.results]
            for device in waiting:
                conn.publish(topics.benchmark_request(device), request.encode(), qos=1, wait=10.0)
            done.wait(min(RESEND_S, max(0.0, end - time.monotonic())))
    finally:
        for topic in subscribed:
            conn.unsubscribe(topic)
    with lock:
        run.silent = sorted(wanted - set(run.results))
    run.elapsed_s = time.monotonic() - start
    return run


def publish_candidates(conn: Connection, topics: Topics, bundles: Sequence[Path]) -> list[str]:
    """Publish benchmark-only candidate bundles like any bundle; their ids, in order."""
    from edgefleet.control.publish.publisher import publish_bundle

    return [publish_bundle(conn, topics, path)[0].bundle_id for path in bundles]


class FleetFarm:
    """Devices named by `target` (a device id or a group) measure each profile's candidates; see the module doc."""

    def __init__(
        self,
        conn: Connection,
        topics: Topics,
        target: str,
        *,
        store: Store | None = None,
        rights: BrokerRights | None = None,
        timeout_s: float = 300.0,
        cpu_share: float = 0.5,
        calls: int = 50,
        rounds: int = 7,
        statuses: Callable[[], Mapping[str, DeviceStatus]] | None = None,
    ) -> None:
        """`statuses`: the devices' latest status where the caller already follows it (a control plane's
        FleetView.statuses; a connection has one handler per topic filter); else the farm subscribes itself."""
        self.conn, self.topics, self.target, self.store = conn, topics, target, store
        self.rights = rights or NoBrokerRights("no rights manager given")
        self.timeout_s, self.cpu_share, self.calls, self.rounds = timeout_s, cpu_share, calls, rounds
        self._lock = threading.Lock()
        self._status: dict[str, DeviceStatus] = {}
        self._statuses = statuses or self._own_statuses
        if statuses is None:  # early: the retained ones arrive while the converter works
            conn.subscribe(topics.all_status(), self._on_status)

    @classmethod
    def of_control_plane(cls, plane: ControlPlane, target: str, **options: Any) -> FleetFarm:
        """The farm of a running control plane: its connection, its rights manager, and its store (the host
        registry's groups and profiles, kept current by its ingestor) for which devices are online."""
        return cls(
            plane.conn, plane.topics, target, store=plane.store, rights=plane.publisher.rights, statuses=dict, **options
        )

    def _own_statuses(self) -> Mapping[str, DeviceStatus]:
        with self._lock:
            return dict(self._status)

    def _on_status(self, topic: str, payload: bytes, retained: bool) -> None:
        device = self.topics.device_id_of(topic)
        if not device or not payload:
            return
        try:
            status = decode(DeviceStatus, payload)
        except MessageError as err:
            log.warning("status on %s ignored: %s", topic, err)
            return
        if status.device_id == device:
            with self._lock:
                self._status[device] = status

    def check(self) -> list[str]:
        """The devices the target names now (online or not): a typo fails before the conversion starts."""
        return [d.device_id for d in self._members()]

    def _members(self) -> list[DeviceRecord]:
        deadline = time.monotonic() + STATUS_WAIT_S
        while True:
            records = merge_status(self.store.devices() if self.store else [], self._statuses())
            try:
                return resolve_target(self.target, records, self.store.groups() if self.store else {})
            except UserInputError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def devices(self, profile: str) -> tuple[list[str], list[str]]:
        """The online devices of the target that run `profile`, and notes on those left out. A name that is no
        device and no group is a user error, once the retained statuses had time to arrive."""
        return for_profile(self._members(), profile)

    def measure(self, profile: str, bundles: Sequence[Path], progress: Callable[[str], None]) -> FarmAnswer:
        devices, notes = self.devices(profile)
        if not devices:
            return FarmAnswer(notes=[*notes, f"no online device of {self.target} runs {profile}"])
        ids = publish_candidates(self.conn, self.topics, bundles)
        with candidate_rights(self.rights, self.topics, devices, ids) as granted:
            if not granted:
                return FarmAnswer(notes=[*notes, f"no device of {self.target} may read the candidates on the broker"])
            progress(
                f"{profile}: {len(ids)} candidate(s) measured on {', '.join(granted)} (up to {self.timeout_s:g} s)"
            )
            run = measure_on_devices(
                self.conn, self.topics, ids, granted, timeout_s=self.timeout_s, cpu_share=self.cpu_share,
                calls=self.calls, rounds=self.rounds,
            )  # fmt: skip
        refused = sorted(set(devices) - set(granted))
        notes += [f"{d} has no role on the broker: not asked" for d in refused]
        return FarmAnswer(results=run.results, silent=run.silent, notes=notes)
