"""A rollout fixture: a control plane with simulated devices and published bundles (v1, v2, …)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.publish.publisher import deploy
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.store import Store
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.rollouts.control_plane import control_plane, enroll, publish, sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker
from support.simulate.agents import Behavior, SimFleet, synthetic_bundle

FAST = {"baseline_s": 1.0, "observe_s": 1.0, "install_timeout_s": 6.0, "report_timeout_s": 2.0, "min_reports": 2}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("sim-bundles")
    return {
        "v1": synthetic_bundle(out, signing_key, version="1", size_bytes=200_000, seed=1),
        "v2": synthetic_bundle(out, signing_key, version="2", size_bytes=200_000, seed=2),
        "v3": synthetic_bundle(out, signing_key, version="3", size_bytes=200_000, seed=4),
        "v2-vnni": synthetic_bundle(out, signing_key, version="2", profile="intel-x86-vnni", seed=3),
    }


class Fleet:
    """A control plane, simulated devices on v1 in one agent-side group, and the bundles published."""

    def __init__(self, plane: Any, sims: SimFleet, group: str, manifests: dict[str, Manifest]) -> None:
        self.plane, self.sims, self.group, self.manifests = plane, sims, group, manifests

    @property
    def store(self) -> Store:
        return self.plane.store  # type: ignore[no-any-return]

    def start(self, bundle: str = "v2", **changes: Any) -> str:
        fields: dict[str, Any] = {
            "group": self.group, "bundles": [bundle_ref(self.manifests[bundle])], "canary": "1",
            "waves": ["50%", "100%"], "timing": FAST,
            "thresholds": {"max_latency_factor": 1.5, "max_golden_drop": 0.01, "max_error_rate": 0.05},
        }  # fmt: skip
        fields.update(changes)
        return prepare_rollout(self.store, make_spec(**fields)).id

    def active(self) -> dict[str, str | None]:
        return {d: s.active_bundle for d, s in self.sims.devices.items()}


@contextlib.contextmanager
def make_fleet(mosquitto: MosquittoBroker, tmp_path: Path, host: Connection, bundles: dict[str, Path], name: str,
           count: int = 4, behavior: Behavior | None = None, **plane_options: Any) -> Iterator[Fleet]:  # fmt: skip
    devices = [f"{name}-{i}" for i in range(count)]
    group = f"{name}-group"
    with (
        control_plane(mosquitto.url, tmp_path, **plane_options) as plane,
        sim_fleet(mosquitto.url, devices, groups=[group], behavior=behavior or Behavior(requests_per_s=100.0)) as sims,
    ):
        manifests = {k: publish(host, plane.store, path) for k, path in bundles.items()}
        deploy(host, Topics(), manifests["v1"], devices=[], groups=[group])
        v1 = manifests["v1"].bundle_id
        wait_until("every device on v1", lambda: all(d.active_bundle == v1 for d in sims.devices.values()))
        wait_until("the registry", lambda: all((r := plane.store.device(d)) and r.running() for d in devices))
        enroll(plane.store, devices, [group])
        yield Fleet(plane, sims, group, manifests)
