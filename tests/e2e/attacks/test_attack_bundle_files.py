"""A device loads only the signed file list: a bundle signed by the REAL bundle key that points its runtime at a
file outside the bundle is refused, with the reason, by real agent processes over a real Mosquitto.

Each attack is counted in the attack ledger. Succeeding means the device committed or served the bundle (or, at
start-up, served a file that lives outside its bundle). After each attack the device still installs a valid
bundle.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx.external_data_helper import convert_model_to_external_data

from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]
REFUSALS = ("refused",)  # refused before its commit: nothing changed on the device


def _refusal(watcher: FleetWatcher, device: str, bundle_id: str, timeout: float = 60.0) -> Event:
    return watcher.wait_for(
        f"{device} refusing {bundle_id}",
        lambda: next(
            (e for e in watcher.events if e.device_id == device and e.bundle_id == bundle_id and e.kind in REFUSALS),
            None,
        ),
        timeout,
    )


def _committed(watcher: FleetWatcher, device: str, bundle_id: str) -> bool:
    return any(e.device_id == device and e.bundle_id == bundle_id and e.kind == "committed" for e in watcher.events)


def _world_writable_copy(source: Path, folder: Path) -> Path:
    """A file outside any bundle that anyone on the device could rewrite: what the attacker wants loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    copy = folder / source.name
    shutil.copyfile(source, copy)
    copy.chmod(0o666)
    return copy


def _with_external_data(
    source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str, location: Callable[[Path], str]
) -> tuple[Path, Path]:
    """A re-signed copy of `source` whose model keeps its weights in external data, every tensor's location set
    to `location(weights file)`: the weights file itself lies outside the bundle and is not in its file list."""
    unpacked = out / f"external-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    model_file = unpacked / manifest.model_path
    model = onnx.load(model_file)
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, model_file)
    weights = _world_writable_copy(model_file.parent / "weights.bin", out / f"outside-{version}")
    (model_file.parent / "weights.bin").unlink()
    model = onnx.load(model_file, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location(weights)
    onnx.save(model, model_file)
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(update={
        "model_version": version, "bundle_id": f"{manifest.bundle_id}-ext{version}", "files": describe_files(sources),
    })  # fmt: skip
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path, weights


def _pointing(source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str, model_path: str) -> Path:
    """A re-signed copy of `source` (same files) whose manifest names `model_path` as the artifact to load."""
    unpacked = out / f"pointing-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    updated = manifest.model_copy(
        update={"model_version": version, "bundle_id": f"{manifest.bundle_id}-path{version}", "model_path": model_path}
    )
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, {entry.path: unpacked / entry.path for entry in manifest.files}, key)
    return path


def _still_installs(host: Connection, topics: Topics, watcher: FleetWatcher, device: str, bundle: Path) -> None:
    bundle_id = deploy_to(host, topics, bundle, devices=(device,))
    watcher.serving(device, bundle_id, timeout=90)


def test_a_model_path_outside_the_bundle_is_refused_though_signed_by_the_real_key(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    device = "atk-model-path"
    agent = start_agent(device)
    v1 = demo_bundles["intel-x86-vnni"]
    v1_id = deploy_to(host, topics, v1, devices=(device,))
    watcher.serving(device, v1_id)
    manifest = Manifest.model_validate_json((agent.state_dir / "bundles" / v1_id / "manifest.json").read_text())
    outside = _world_writable_copy(agent.state_dir / "bundles" / v1_id / manifest.model_path, tmp_path / "world")
    depth = len(manifest.model_path.split("/")) + 3  # bundles/<id>/<model_path> -> up to tmp_path
    attempts = {
        "model_path: an absolute path to a world-writable file (real bundle key)": str(outside),
        "model_path: ../ out of the bundle to a world-writable file (real bundle key)": "../" * depth
        + "world/"
        + outside.name,
    }
    for version, (name, model_path) in enumerate(attempts.items(), start=2):
        bundle = _pointing(v1, tmp_path, signing_key, trusted, str(version), model_path)
        bundle_id = deploy_to(host, topics, bundle, devices=(device,))
        event = _refusal(watcher, device, bundle_id)
        assert "model_path" in event.detail and "not a relative path inside the bundle" in event.detail
        downloaded = any(e.bundle_id == bundle_id and e.kind == "download-started" for e in watcher.events)
        succeeded = _committed(watcher, device, bundle_id) or slot_of(watcher.status[device]).active_bundle != v1_id
        assert not downloaded, "refused from the signed manifest alone, before a block is fetched"
        assert not attack_ledger.record(name, succeeded, event.detail)
    _still_installs(host, topics, watcher, device, derive_bundle(v1, tmp_path, signing_key, trusted, model_version="9"))
    assert agent.alive


def test_external_data_outside_the_bundle_is_refused_though_signed_by_the_real_key(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    """The weights are the bundle's own, so a runtime that followed the path would serve correct answers: only the
    agent's own check of where the file lies stops it (not ONNX Runtime's)."""
    device = "atk-external-data"
    agent = start_agent(device)
    v1 = demo_bundles["intel-x86-vnni"]
    v1_id = deploy_to(host, topics, v1, devices=(device,))
    watcher.serving(device, v1_id)
    attempts: dict[str, Callable[[Path], str]] = {
        "external data: an absolute location outside the bundle (real bundle key)": str,
        "external data: a ../ location out of the bundle (real bundle key)": lambda weights: (
            "../" * 12 + str(weights).lstrip("/")
        ),
    }
    for version, (name, location) in enumerate(attempts.items(), start=2):
        bundle, weights = _with_external_data(v1, tmp_path, signing_key, trusted, str(version), location)
        bundle_id = deploy_to(host, topics, bundle, devices=(device,))
        event = _refusal(watcher, device, bundle_id, timeout=90)
        assert "external data of tensor" in event.detail and "not a relative path inside the bundle" in event.detail
        assert weights.exists()
        succeeded = _committed(watcher, device, bundle_id) or slot_of(watcher.status[device]).active_bundle != v1_id
        assert not attack_ledger.record(name, succeeded, event.detail)
    _still_installs(host, topics, watcher, device, derive_bundle(v1, tmp_path, signing_key, trusted, model_version="9"))
    assert agent.alive


def test_a_signed_file_swapped_for_a_link_outside_the_bundle_is_refused_at_start_up(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    """While the agent is down, the committed bundle's model file becomes a link to an identical copy elsewhere:
    every hash still matches, so only resolving the link shows it. The agent starts on the previous bundle."""
    device = "atk-restore-link"
    agent = start_agent(device)
    v1 = demo_bundles["intel-x86-vnni"]
    v1_id = deploy_to(host, topics, v1, devices=(device,))
    watcher.serving(device, v1_id)
    v2_id = deploy_to(host, topics, derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2"),
                      devices=(device,))  # fmt: skip
    watcher.serving(device, v2_id)
    agent.stop()
    bundle_dir = agent.state_dir / "bundles" / v2_id
    manifest = Manifest.model_validate_json((bundle_dir / "manifest.json").read_text())
    model_file = bundle_dir / manifest.model_path
    outside = _world_writable_copy(model_file, tmp_path / "world-restore")
    model_file.unlink()
    model_file.symlink_to(outside)
    agent.start()
    status = watcher.wait_for(
        f"{device} back on {v1_id}",
        lambda: (
            (s := watcher.status.get(device))
            and s.online
            and slot_of(s).active_bundle == v1_id
            and slot_of(s).last_error
            and s
        ),
        timeout=90,
    )
    last_error = slot_of(status).last_error
    assert last_error is not None and "symbolic link to outside the bundle" in last_error
    went_back = watcher.event(device, "rolled-back", bundle_id=v2_id)  # from a bundle it had committed
    assert "does not check out at start-up" in went_back.detail and f"now serving {v1_id}" in went_back.detail
    succeeded = slot_of(status).active_bundle == v2_id
    assert not attack_ledger.record(
        "a signed model file swapped on disk for a link outside the bundle (start-up)", succeeded, last_error
    )
    _still_installs(host, topics, watcher, device, derive_bundle(v1, tmp_path, signing_key, trusted, model_version="9"))
    assert agent.alive
