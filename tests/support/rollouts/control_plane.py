"""Helpers for the control-plane tests (no tests here): a control plane, simulated devices, waiting."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.control.rollout.engine import load_doc
from edgefleet.control.rollout.plan import RolloutDoc
from edgefleet.control.server import ControlConfig, ControlPlane
from edgefleet.control.store import BundleRecord, Store
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.simulate.agents import Behavior, SimFleet

T = TypeVar("T")


def wait_until(what: str, predicate: Callable[[], T | None], timeout: float = 30.0, every: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def control_config(broker: str, store_dir: Path, **changes: Any) -> ControlConfig:
    options: dict[str, Any] = {
        "broker": broker, "store_url": f"sqlite://{store_dir}/control.sqlite", "http_port": None, "tick_s": 0.2,
        "sync_every_s": 1.0, "compact_every_s": 0, "instance": f"t{time.monotonic_ns() % 10**9}",
    }  # fmt: skip
    options.update(changes)
    return ControlConfig(**options)


@contextlib.contextmanager
def control_plane(
    broker: str, store_dir: Path, retire: bool = True, store: Store | None = None, **changes: Any
) -> Iterator[ControlPlane]:
    """A control plane that retires when done (leaving no persistent session in the shared group)."""
    plane = ControlPlane(control_config(broker, store_dir, **changes), store=store).start()
    try:
        yield plane
    finally:
        plane.stop(retire=retire)


@contextlib.contextmanager
def sim_fleet(broker: str, device_ids: list[str], **options: Any) -> Iterator[SimFleet]:
    options.setdefault("telemetry_interval", 0.25)
    options.setdefault("behavior", Behavior(requests_per_s=100.0))
    fleet = SimFleet(broker, device_ids, **options).start()
    try:
        assert fleet.wait_connected(30), "simulated devices did not connect"
        yield fleet
    finally:
        fleet.stop()


def publish(host: Connection, store: Store, bundle: Path) -> Manifest:
    """Publish a bundle and record it in the store's publish history with its facts, as `rollout start` does."""
    from edgefleet.control.rollout.judge.bundle_facts import record_facts

    manifest, offer = publish_bundle(host, Topics(), bundle)
    store.put_bundle(
        BundleRecord(manifest.bundle_id, manifest.model_name, manifest.model_version, manifest.profile,
                     offer.transfer.size, manifest.accuracy.budget, time.time())
    )  # fmt: skip
    record_facts(store, bundle, manifest, offer.transfer)
    return manifest


def rollout(store: Store, rollout_id: str) -> RolloutDoc:
    row = store.rollout(rollout_id)
    assert row is not None
    return load_doc(row)


def finished(store: Store, rollout_id: str, timeout: float = 60.0) -> RolloutDoc:
    return wait_until(
        f"rollout {rollout_id} to finish",
        lambda: (lambda d: d if not d.active else None)(rollout(store, rollout_id)),
        timeout,
    )


def enroll(store: Store, device_ids: list[str], groups: list[str], profile: str | None = "generic-x86-64") -> None:
    """`edgefleet devices enroll` for devices the store has seen: the host's record of their profile and groups,
    which a rollout plans by (a device's own report never decides). `profile=None`: the profile each reports now,
    confirmed by the operator (as `devices enroll` without `--profile` does)."""
    from edgefleet.control.fleet.registry import enrolment_labels

    for device_id in device_ids:
        seen = wait_until(f"{device_id} in the registry", lambda d=device_id: store.device(d))  # type: ignore[misc]
        store.set_labels(device_id, enrolment_labels(profile or seen.profile, groups))
