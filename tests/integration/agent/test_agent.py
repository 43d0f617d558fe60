"""The agent as a real subprocess on a real Mosquitto: install, serve, refuse, survive, restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.messages import WireTensor
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import detect_profile
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, attacker_keys, deploy_to, derive_bundle
from support.paths import DIGITS
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]


def _eval_samples(count: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    with np.load(DIGITS / "eval.npz") as data:
        return [{"input": data["input"][i]} for i in range(count)], data["labels"][:count]


def test_an_agent_installs_serves_and_reports(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    agent = start_agent("dev-serve", groups=("line-1",))
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], groups=("line-1",))
    status = watcher.serving("dev-serve", bundle_id)
    assert slot_of(status).provider_in_use == "CPUExecutionProvider" and status.profile == "intel-x86-vnni"
    watcher.event("dev-serve", "committed", bundle_id=bundle_id)  # events travel through the spool
    kinds = [e.kind for e in watcher.events if e.device_id == "dev-serve"]
    for expected in ("desired", "verified", "download-started", "downloaded", "installed", "committed"):
        assert expected in kinds

    samples, labels = _eval_samples(40)
    remote = RemoteModel(host, topics, "dev-serve")
    answers = remote.infer_many(samples)
    predicted = np.array([a.outputs["logits"].to_array().argmax() for a in answers])
    assert all(a.ok and a.bundle_id == bundle_id for a in answers)
    assert np.mean(predicted == labels) >= 0.95

    report = watcher.wait_for(
        "telemetry covering the requests",
        lambda: next((t for t in watcher.telemetry if t.device_id == "dev-serve" and t.latency.count >= 40), None),
    )
    assert report.latency.p50_ms and report.latency.p95_ms and report.latency.p99_ms
    assert report.golden_agreement == 1.0 and report.rss_mb > 0 and report.provider == "CPUExecutionProvider"
    assert agent.alive


def test_bad_inference_requests_get_clear_errors_and_the_agent_keeps_serving(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    agent = start_agent("dev-bad-input")
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("dev-bad-input",))
    watcher.serving("dev-bad-input", bundle_id)
    remote = RemoteModel(host, topics, "dev-bad-input")
    wrong_shape, wrong_dtype, wrong_name = remote.infer_many(
        [
            {"input": np.zeros((1, 1, 8, 9), np.float32)},
            {"input": np.zeros((1, 1, 8, 8), np.float64)},
            {"pixels": np.zeros((1, 1, 8, 8), np.float32)},
        ]
    )
    assert not wrong_shape.ok and "dimension 3 is 9, the model wants 8" in (wrong_shape.error or "")
    assert not wrong_dtype.ok and "dtype float64 but the model wants float32" in (wrong_dtype.error or "")
    assert not wrong_name.ok and "missing ['input'], unexpected ['pixels']" in (wrong_name.error or "")
    host.publish(topics.infer_request("dev-bad-input"), b"\xff not json", qos=1, wait=5)
    (good,) = remote.infer_many([{"input": np.zeros((1, 1, 8, 8), np.float32)}])
    assert good.ok and agent.alive


def test_malformed_desired_messages_are_refused_with_a_reason(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher
) -> None:
    agent = start_agent("dev-junk")
    watcher.wait_for("dev-junk online", lambda: watcher.status.get("dev-junk"))
    for payload in (b"{not json", b'{"schema_version": 1}', b'{"schema_version": 7, "bundle_id": "x"}', b"\x00" * 9):
        host.publish(topics.device_desired("dev-junk", "default"), payload, qos=1, retain=True, wait=5)
    event = watcher.event("dev-junk", "refused")
    assert "not a signed desired document" in event.detail
    time.sleep(0.5)
    assert agent.alive and watcher.status["dev-junk"].online
    host.publish(topics.device_desired("dev-junk", "default"), b"", qos=1, retain=True, wait=5)


def test_bundles_signed_by_an_untrusted_key_are_refused_before_download(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, trusted: TrustedKeys, host_keys: HostKeys,
) -> None:  # fmt: skip
    stranger = attacker_keys(tmp_path / "stranger", host_keys)
    forged = derive_bundle(demo_bundles["intel-x86-vnni"], tmp_path, stranger.bundle_key(), trusted, model_version="5")
    agent = start_agent("dev-forged")
    manifest, _ = publish_bundle(host, topics, forged, keys=stranger)  # the offer, too, is signed by the stranger
    bundle_id = manifest.bundle_id
    deploy(host, topics, manifest, devices=["dev-forged"], groups=[])
    event = watcher.event("dev-forged", "refused", bundle_id=bundle_id)
    assert "untrusted key" in event.detail
    assert not any(e.kind == "download-started" for e in watcher.events if e.device_id == "dev-forged")
    assert agent.alive and slot_of(watcher.status["dev-forged"]).active_bundle is None


def test_a_bundle_for_another_profile_is_refused(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    start_agent("dev-profile", profile="generic-x86-64")
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("dev-profile",))
    event = watcher.event("dev-profile", "refused", bundle_id=bundle_id)
    assert "built for profile intel-x86-vnni; this device is generic-x86-64" in event.detail


def test_a_device_runs_bundles_for_the_profiles_its_own_refines_unprompted(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    start_agent("dev-auto-profile", profile="auto")  # an AVX-512 VNNI machine detects intel-x86-vnni
    bundle_id = deploy_to(host, topics, demo_bundles["generic-x86-64"], devices=("dev-auto-profile",))
    status = watcher.serving("dev-auto-profile", bundle_id)
    assert status.profile == detect_profile().name and status.accepts_profiles[0] == status.profile
    assert "generic-x86-64" in status.accepts_profiles
    assert status.profile_detection[0].startswith(f"{status.profile} matches: arch "), status.profile_detection


def test_versions_only_go_up_unless_the_host_marks_a_rollback(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    v1 = demo_bundles["intel-x86-vnni"]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    start_agent("dev-versions")
    v2_id = deploy_to(host, topics, v2, devices=("dev-versions",))
    watcher.serving("dev-versions", v2_id)

    v1_id = deploy_to(host, topics, v1, devices=("dev-versions",))
    event = watcher.event("dev-versions", "refused", bundle_id=v1_id)  # nothing changed on the device
    assert "version 1 is not newer than 2" in event.detail
    assert slot_of(watcher.status["dev-versions"]).active_bundle == v2_id, "the device keeps serving v2"

    deploy_to(host, topics, v1, devices=("dev-versions",), rollback=True)
    watcher.serving("dev-versions", v1_id)


def test_the_same_signed_bundle_installs_again_after_a_rollback_and_no_other_bundle_reuses_its_version(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """A rollout retried after its rollback: the exact bundle that committed the floor version installs again; a
    different bundle at that version, and an older version, are still refused (docs/trust.md)."""
    v1 = demo_bundles["intel-x86-vnni"]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    start_agent("dev-retry")
    v1_id = deploy_to(host, topics, v1, devices=("dev-retry",))
    watcher.serving("dev-retry", v1_id)
    v2_id = deploy_to(host, topics, v2, devices=("dev-retry",))
    watcher.serving("dev-retry", v2_id)
    deploy_to(host, topics, v1, devices=("dev-retry",), rollback=True)  # the rollout rolled back
    watcher.serving("dev-retry", v1_id)

    deploy_to(host, topics, v2, devices=("dev-retry",))  # retried: the same signed bundle
    watcher.serving("dev-retry", v2_id)

    other = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2", bundle_id=f"{v2_id}-other")
    other_id = deploy_to(host, topics, other, devices=("dev-retry",))
    event = watcher.event("dev-retry", "refused", bundle_id=other_id)
    assert "version 2 is not newer than 2" in event.detail
    deploy_to(host, topics, v1, devices=("dev-retry",))  # older, and not marked as a rollback
    event = watcher.event("dev-retry", "refused", bundle_id=v1_id)
    assert "version 1 is not newer than 2" in event.detail
    assert slot_of(watcher.status["dev-retry"]).active_bundle == v2_id


def test_after_kill_9_the_agent_restarts_on_its_committed_bundle_without_downloading(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    agent = start_agent("dev-crash")
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("dev-crash",))
    watcher.serving("dev-crash", bundle_id)
    agent.kill9()
    watcher.wait_for("the last will", lambda: not watcher.status["dev-crash"].online, timeout=60)
    before = len(watcher.events)
    agent.start()
    watcher.serving("dev-crash", bundle_id)
    time.sleep(1.0)
    after = [e.kind for e in watcher.events[before:] if e.device_id == "dev-crash"]
    assert "download-started" not in after, "a committed bundle is never fetched again"
    remote = RemoteModel(host, topics, "dev-crash")
    (answer,) = remote.infer_many([{"input": np.zeros((1, 1, 8, 8), np.float32)}])
    assert answer.ok and answer.bundle_id == bundle_id


def test_wire_tensors_round_trip() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(WireTensor.of(array).to_array(), array)


def test_a_committed_bundle_whose_files_change_on_disk_is_rolled_back(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    v1 = demo_bundles["intel-x86-vnni"]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="3")
    agent = start_agent("dev-health", extra=("--health-interval", "0.5"))
    v1_id = deploy_to(host, topics, v1, devices=("dev-health",))
    watcher.serving("dev-health", v1_id)
    v2_id = deploy_to(host, topics, v2, devices=("dev-health",))
    watcher.serving("dev-health", v2_id)

    model_file = agent.state_dir / "bundles" / v2_id / "model" / "model.onnx"
    model_file.write_bytes(model_file.read_bytes()[:-10])  # bit rot on the device's disk
    failed = watcher.event("dev-health", "health-failed", bundle_id=v2_id)
    assert "installed file model/model.onnx is missing or modified" in failed.detail
    watcher.event("dev-health", "rolled-back", bundle_id=v2_id)
    status = watcher.serving("dev-health", v1_id)
    assert v2_id in (slot_of(status).last_error or "")
    time.sleep(1.5)
    assert slot_of(watcher.status["dev-health"]).active_bundle == v1_id, "the desired v2 is not re-installed in a loop"


def test_under_systemd_the_agent_says_ready_and_pings_the_watchdog(start_agent: StartAgent, tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(20)
        start_agent("dev-systemd", env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
        seen: set[str] = set()
        while not {"READY=1", "WATCHDOG=1"} <= seen:
            seen.update(sock.recv(4096).decode().splitlines())
    assert "STATUS=idle" in seen or any(line.startswith("STATUS=") for line in seen)


def test_a_device_that_comes_online_after_the_deployment_still_gets_its_bundle(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    bundle_id = deploy_to(host, topics, demo_bundles["generic-x86-64"], groups=("late-group",))
    time.sleep(1.0)  # nobody is listening: everything the device needs is retained on the broker
    start_agent("dev-late", profile="generic-x86-64", groups=("late-group",), extra=("--protocol", "3.1.1"))
    watcher.serving("dev-late", bundle_id)


def test_the_local_api_serves_and_field_feedback_reaches_telemetry(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path]
) -> None:
    import json
    import urllib.request

    from support.servers.brokers import free_port

    port = free_port()
    start_agent("dev-api", extra=("--http-port", str(port)))
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("dev-api",))
    watcher.serving("dev-api", bundle_id)
    samples, labels = _eval_samples(20)
    base = f"http://127.0.0.1:{port}/v1/models/digits-cnn"

    def post(url: str, document: dict) -> dict:
        request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    for feeds, label in zip(samples, labels, strict=True):
        request = {"inputs": {"input": {"dtype": "float32", "shape": [1, 1, 8, 8],
                                        "data": feeds["input"].tolist()}}}  # fmt: skip
        document = post(f"{base}/infer", request)
        assert document["bundle_id"] == bundle_id
        scored = post(f"{base}/feedback", {"request_id": document["request_id"], "label": int(label)})
    assert scored["samples"] == 20 and scored["field_accuracy"] >= 0.9
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert 'edgefleet_field_accuracy{model="digits-cnn"}' in answer.read().decode()
    report = watcher.wait_for(
        "telemetry with field accuracy",
        lambda: next((t for t in watcher.telemetry if t.device_id == "dev-api" and t.field_samples == 20), None),
    )
    assert report.field_accuracy == scored["field_accuracy"] and report.latency.count >= 20
