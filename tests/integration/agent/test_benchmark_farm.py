"""The fleet as the benchmark farm, device and host sides, with real agents on a real Mosquitto: candidates are
fetched and verified, measured in a time-bounded worker under a CPU share, reported, and never installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.agent.runtime.benchmark import cores_for
from edgefleet.control.farm.service import measure_on_devices, publish_candidates
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]


def _online(watcher: FleetWatcher, device: str) -> bool | None:
    status = watcher.status.get(device)
    return True if status is not None and status.online else None


def test_a_cpu_share_is_at_least_one_core_and_never_more_than_asked() -> None:
    assert cores_for(0.5, [0, 1]) == [1]
    assert cores_for(1.0, [0, 1]) == [0, 1]
    assert cores_for(0.1, [0, 1, 2, 3]) == [3]
    assert cores_for(0.5, [0, 1, 2, 3]) == [2, 3]


@pytest.mark.slow
def test_devices_measure_candidates_with_their_own_settings_and_never_install_them(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, keys: tuple[Path, Path],
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    candidates = [
        derive_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, benchmark_only=True),
        derive_bundle(demo_bundles["generic-x86-64"], tmp_path, signing_key, trusted, benchmark_only=True),
    ]
    start_agent("farm-one-thread")  # --threads 1
    start_agent("farm-two-threads", extra=("--threads", "2"))
    for device in ("farm-one-thread", "farm-two-threads"):
        watcher.wait_for(f"{device} online", lambda d=device: _online(watcher, d), timeout=60)
    ids = publish_candidates(host, topics, candidates)
    run = measure_on_devices(
        host, topics, ids, ["farm-one-thread", "farm-two-threads", "farm-absent"], timeout_s=120, calls=20, rounds=3
    )
    assert run.silent == ["farm-absent"], "a device that does not answer in time is reported as silent"
    for device, threads in (("farm-one-thread", 1), ("farm-two-threads", 2)):
        result = run.results[device]
        assert result.ok and result.profile == "intel-x86-vnni" and 0 < result.cpu_share <= 0.5
        assert [c.bundle_id for c in result.candidates] == ids
        for figures in result.candidates:
            assert figures.ok, figures.error
            assert figures.threads == threads and figures.golden_passed
            assert figures.provider in figures.providers_measured or len(figures.providers_measured) <= 1
            assert figures.p50_ms is not None and figures.p50_ms <= figures.p90_ms <= figures.p99_ms  # type: ignore[operator]
            assert figures.load_ms is not None and figures.peak_rss_mb is not None and figures.peak_rss_mb > 10
    # Measured, never installed: nothing was committed, and a candidate offered as desired state is refused.
    assert slot_of(watcher.status["farm-one-thread"]).active_bundle is None
    bundle_id = deploy_to(host, topics, candidates[0], devices=("farm-one-thread",))
    refused = watcher.event("farm-one-thread", "refused", bundle_id=bundle_id)
    assert "benchmark-only candidate" in refused.detail


def test_a_device_refuses_to_measure_a_bundle_that_is_not_a_candidate(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    start_agent("farm-strict")
    watcher.wait_for("farm-strict online", lambda: _online(watcher, "farm-strict"), timeout=60)
    ids = publish_candidates(host, topics, [demo_bundles["intel-x86-vnni"]])
    run = measure_on_devices(host, topics, ids, ["farm-strict"], timeout_s=60, calls=5, rounds=1)
    (figures,) = run.results["farm-strict"].candidates
    assert not figures.ok and "not marked benchmark-only" in (figures.error or "")
