"""The agent updates itself (issue 35 items 3-4), on the SHIPPED secure Mosquitto, with real agents under the real
launcher (edgefleet/launcher/, as the shipped systemd unit runs it).

Two devices serve the digits CNN on the base install (edgefleet 0.1.0, this checkout). A signed desired document
names agent release 0.2.0 (this tree's wheel at another version, with its dependency wheels); each agent fetches it
over the chunk transfer, verifies it, builds its environment offline and hands over; the launcher starts 0.2.0 on
trial, and commits it once the new agent is connected, serves its committed bundle through its golden set and its
status was acknowledged. Then:
- a broken 0.3.0 (its agent exits at start) fails its health gate on dc-1: the launcher starts 0.2.0 again and the
  device reports why; the 0.3.0 fetch took the unchanged dependency wheels from the 0.2.0 release it holds;
- `kill -9` of the new agent during dc-2's switch to 0.4.0: rolled back, 0.2.0 serves;
- `kill -9` of the launcher during dc-1's switch to 0.4.0: the next launcher (what systemd would start) ends nothing
  twice, resumes the trial and commits 0.4.0.
After every step the device answers an inference request with its bundle, and at the end `fleet status`'s rows show
each device's agent version and its last update.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import publish_desired
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.fleet.status import FleetView
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.control.publish.release import publish_release
from edgefleet.control.rights.deploy import grant_deploy
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.launcher_files import launcher_dir, read_json, read_state
from edgefleet.core.messages import AgentRelease, Desired, DeviceStatus, Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.release import parse_release_manifest, read_release
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.agent_releases import LauncherProcess, build_agent_wheel, dependency_wheels, release_file
from support.fleet import FleetWatcher
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki
from support.slots import slot_of

PROFILE = "intel-x86-vnni"
TOPICS = Topics()
DEVICES = {"dc-1": ["lab"], "dc-2": ["lab"]}
SWITCH_S = 200.0  # fetch, an offline install on a loaded 2-core machine, the new agent's start and gate


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    hosts = (HOST_IDENTITY, CLI_IDENTITY)
    pki = make_pki(tmp_path / "pki", list(DEVICES), hosts=hosts)
    with SecureBroker(pki, DEVICES, host_users=hosts) as broker:
        yield broker


def _launcher(broker: SecureBroker, device: str, tmp_path: Path, root_pub: Path) -> LauncherProcess:
    tls = broker.pki.tls(device)
    args = ["--broker", broker.url, "--device-id", device, "--profile", PROFILE, "--trust", str(root_pub),
            "--telemetry-interval", "1", "--threads", "1", "--http-port", "0", "--group", "lab",
            "--ca", str(tls.ca), "--cert", str(tls.cert), "--key", str(tls.key)]  # fmt: skip
    return LauncherProcess(tmp_path / device, args).start()


def _want(conn: Connection, keys: HostKeys, manifest_json: str, device: str, release: Path | None) -> None:
    """The device's signed desired document: the bundle, and the agent release (None: none named)."""
    manifest = parse_manifest(manifest_json)
    ref = None
    if release is not None:
        rel = parse_release_manifest(read_release(release).manifest_json)
        ref = AgentRelease(release_id=rel.release_id, version=rel.version)
    desired = Desired(bundle_id=manifest.bundle_id, model_name=manifest.model_name,
                      model_version=manifest.model_version, profile=manifest.profile, agent_release=ref)  # fmt: skip
    publish_desired(conn, TOPICS, keys, desired, device=device, wait=10)


def _on_version(watcher: FleetWatcher, device: str, version: str, bundle_id: str, update: str = "") -> DeviceStatus:
    """The device's status: online on agent `version`, serving `bundle_id` verified (and `update` in agent_update)."""

    def check() -> DeviceStatus | None:
        status = watcher.status.get(device)
        ok = status and status.online and status.agent_version == version and update in (status.agent_update or "")
        entry = slot_of(status, "default") if ok else None
        return status if entry is not None and entry.active_bundle == bundle_id and entry.verified else None

    return watcher.wait_for(f"{device} on agent {version} serving {bundle_id}", check, SWITCH_S)


def _event(watcher: FleetWatcher, device: str, kind: str, text: str, after: int = 0) -> Event:
    def check() -> Event | None:
        return next((e for e in watcher.events[after:] if e.device_id == device and e.kind == kind
                     and text in e.detail), None)  # fmt: skip

    return watcher.wait_for(f"{device} event {kind} ({text})", check, SWITCH_S)


def _answers(host: Connection, device: str, bundle_id: str) -> None:
    (answer,) = RemoteModel(host, TOPICS, device).infer_many([{"input": np.zeros((1, 1, 8, 8), np.float32)}])
    assert answer.ok and answer.bundle_id == bundle_id, answer


def _child(device_dir: Path) -> dict[str, object]:
    return read_json(launcher_dir(device_dir) / "child.json") or {}


def _trial_running(device_dir: Path, release_id: str, before: dict[str, object]) -> dict[str, object]:
    """Wait until the launcher runs `release_id` on trial in a new agent process (`before`: the child record of the
    agent that ran before); that agent's record."""
    deadline = time.monotonic() + SWITCH_S
    while time.monotonic() < deadline:
        state = read_state(launcher_dir(device_dir)) or {}
        trial, child = state.get("trial"), _child(device_dir)
        if isinstance(trial, dict) and trial.get("release_id") == release_id and child and child != before:
            return child
        time.sleep(0.05)
    raise AssertionError(f"{device_dir.name} never started {release_id} on trial")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
# Several switches, each allowed SWITCH_S (129 s in all in a full run here): the test's budget is its own waits,
# not the suite's 300 s default.
@pytest.mark.timeout(int(6 * SWITCH_S))
def test_agents_update_themselves_roll_back_a_broken_release_and_survive_kill_9(
    secure: SecureBroker, tmp_path: Path, root_pub: Path, host_keys: HostKeys, demo_bundles: dict[str, Path],
) -> None:  # fmt: skip
    deps = dependency_wheels()
    agent_wheel = build_agent_wheel(tmp_path / "agent-wheel")
    releases = {v: release_file(agent_wheel, deps, v, tmp_path, host_keys, broken=v == "0.3.0")
                for v in ("0.2.0", "0.3.0", "0.4.0")}  # fmt: skip
    host = secure.connect(HOST_IDENTITY)
    watcher = FleetWatcher(host, TOPICS)
    bundle = demo_bundles[PROFILE]
    manifest_json = read_signed_manifest(bundle).manifest_json
    manifest, _ = publish_bundle(host, TOPICS, bundle)
    grant_deploy(host, TOPICS, manifest.bundle_id, devices=list(DEVICES), keys=host_keys)
    launchers = {d: _launcher(secure, d, tmp_path, root_pub) for d in DEVICES}
    try:
        for device in DEVICES:
            _want(host, host_keys, manifest_json, device, None)
        for device in DEVICES:
            _on_version(watcher, device, "0.1.0", manifest.bundle_id)

        # 1. Both devices move to 0.2.0 and commit it.
        _, offer, _ = publish_release(host, TOPICS, releases["0.2.0"], keys=host_keys)
        for device in DEVICES:
            _want(host, host_keys, manifest_json, device, releases["0.2.0"])
        for device in DEVICES:
            _on_version(watcher, device, "0.2.0", manifest.bundle_id, f"{offer.release_id} committed")
            _event(watcher, device, "agent-committed", offer.release_id)
            _answers(host, device, manifest.bundle_id)

        # 2. A broken 0.3.0 fails its health gate on dc-1 and is rolled back, with its reason.
        mark = len(watcher.events)
        _, broken, _ = publish_release(host, TOPICS, releases["0.3.0"], keys=host_keys)
        _want(host, host_keys, manifest_json, "dc-1", releases["0.3.0"])
        fetched = _event(watcher, "dc-1", "agent-release", "fetched", mark)
        rolled = _event(watcher, "dc-1", "agent-rolled-back", broken.release_id, mark)
        assert "exited with code 1" in rolled.detail and "broken on purpose" in rolled.detail, rolled.detail
        _on_version(watcher, "dc-1", "0.2.0", manifest.bundle_id, f"{broken.release_id} rolled back")
        _answers(host, "dc-1", manifest.bundle_id)
        # Only the changed edgefleet wheel travelled: the dependency wheels came from the 0.2.0 release it holds.
        wheel_bytes = agent_wheel.stat().st_size
        fetched_bytes = int(fetched.detail.split(" bytes fetched")[0].rsplit(" ", 1)[-1])
        assert fetched_bytes < 2 * wheel_bytes + 256 * 1024 < broken.transfer.size / 10, fetched.detail
        state = read_state(launcher_dir(tmp_path / "dc-1")) or {}
        assert broken.release_id in state["failed"] and state["committed"]["version"] == "0.2.0"

        # 3. kill -9 of the new agent during dc-2's switch to 0.4.0: rolled back, 0.2.0 serves again.
        mark = len(watcher.events)
        _, v4, _ = publish_release(host, TOPICS, releases["0.4.0"], keys=host_keys)
        before = _child(tmp_path / "dc-2")
        _want(host, host_keys, manifest_json, "dc-2", releases["0.4.0"])
        child = _trial_running(tmp_path / "dc-2", v4.release_id, before)
        os.kill(int(child["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        rolled = _event(watcher, "dc-2", "agent-rolled-back", v4.release_id, mark)
        assert "exited with code -9" in rolled.detail, rolled.detail
        _on_version(watcher, "dc-2", "0.2.0", manifest.bundle_id, f"{v4.release_id} rolled back")
        _answers(host, "dc-2", manifest.bundle_id)

        # 4. kill -9 of the launcher during dc-1's switch to 0.4.0: the next launcher resumes the trial and commits.
        mark = len(watcher.events)
        before = _child(tmp_path / "dc-1")
        _want(host, host_keys, manifest_json, "dc-1", releases["0.4.0"])
        child = _trial_running(tmp_path / "dc-1", v4.release_id, before)
        launchers["dc-1"].kill9()
        deadline = time.monotonic() + 10
        while _alive(int(child["pid"])) and time.monotonic() < deadline:  # type: ignore[call-overload]
            time.sleep(0.05)
        assert not _alive(int(child["pid"])), "the agent outlived its killed launcher"  # type: ignore[call-overload]
        launchers["dc-1"] = LauncherProcess(tmp_path / "dc-1", launchers["dc-1"].agent_args).start()
        _event(watcher, "dc-1", "agent-committed", v4.release_id, mark)
        _on_version(watcher, "dc-1", "0.4.0", manifest.bundle_id, f"{v4.release_id} committed")
        _answers(host, "dc-1", manifest.bundle_id)
        state = read_state(launcher_dir(tmp_path / "dc-1")) or {}
        assert state["committed"]["version"] == "0.4.0" and state["previous"]["version"] == "0.2.0"
        assert state["outcomes"][-1]["reason"] == "passed its health gate (attempt 2)"

        # `fleet status` shows each device's agent version and its last update.
        view = FleetView(host, TOPICS)
        wanted = {"dc-1": "0.4.0", "dc-2": "0.2.0"}
        rows = watcher.wait_for(
            "fleet status rows with each device's agent version",
            lambda: (r := {row.device_id: row for row in view.rows()}) and
            {d: row.agent_version for d, row in r.items()} == wanted and r,
            30,
        )  # fmt: skip
        assert "rolled back" in (rows["dc-2"].agent_update or "") and "committed" in (rows["dc-1"].agent_update or "")
    finally:
        for launcher in launchers.values():
            launcher.stop()
        host.stop()
        for device, launcher in launchers.items():
            print(f"--- {device} launcher log (tail)\n" + "\n".join(launcher.log().splitlines()[-60:]))
