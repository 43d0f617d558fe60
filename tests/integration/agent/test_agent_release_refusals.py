"""A real agent refuses agent releases it must not run, before it fetches a byte (agent/release/updater.py), and
says why in a `refused` event and its status (`agent_update`): a release offer signed by the bundle key instead of
the release key, a version below its agent floor without a signed downgrade naming it, a release built for another
Python, and any release at all when no launcher started it (only the launcher can switch an agent). It keeps
serving its model throughout. The releases' wheels are stand-ins: nothing gets as far as installing them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import publish_desired
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.publish.chunks import publish_chunks
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.messages import AgentRelease, Desired, Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.release import build_release, parse_release_manifest, read_release, sign_release_offer
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.fleet import AgentProcess, FleetWatcher


def _release(tmp_path: Path, version: str, key: SigningKey, *, python: str | None = None) -> Path:
    wheels = tmp_path / f"wheels-{version}-{python}"
    wheels.mkdir(parents=True)
    (wheels / f"edgefleet-{version}-py3-none-any.whl").write_bytes(version.encode() * 4000)
    (wheels / "dep-1.0-py3-none-any.whl").write_bytes(b"a dependency" * 3000)
    out = tmp_path / f"agent-{version}-{python}.release"
    build_release(wheels, version, key, out, python=python)
    return out


def _offer(host: Connection, topics: Topics, release: Path, key: SigningKey, keys: HostKeys) -> AgentRelease:
    """Publish the release's chunks and an offer signed by `key` (as `release publish` does with the release key)."""
    manifest_json = read_release(release).manifest_json
    manifest = parse_release_manifest(manifest_json)
    done = publish_chunks(host, topics, release, max_size=128 * 1024, known={})
    offer = sign_release_offer(manifest.release_id, manifest_json, done.transfer(release.stat().st_size, 128 * 1024),
                               key, keys.keyset())  # fmt: skip
    host.publish(topics.agent_release_offer(manifest.release_id), offer.encode(), qos=1, retain=True, wait=10)
    return AgentRelease(release_id=manifest.release_id, version=manifest.version)


def _want(host: Connection, topics: Topics, keys: HostKeys, bundle: Path, device: str, ref: AgentRelease) -> None:
    m = parse_manifest(read_signed_manifest(bundle).manifest_json)
    desired = Desired(bundle_id=m.bundle_id, model_name=m.model_name, model_version=m.model_version,
                      profile=m.profile, agent_release=ref)  # fmt: skip
    publish_desired(host, topics, keys, desired, device=device, wait=10)


def _refused(watcher: FleetWatcher, device: str, text: str) -> Event:
    def check() -> Event | None:
        return next((e for e in watcher.events if e.device_id == device and e.kind == "refused"
                     and "agent release" in e.detail and text in e.detail), None)  # fmt: skip

    return watcher.wait_for(f"{device} refusing an agent release ({text})", check, 60)


def test_an_agent_refuses_releases_it_must_not_run_and_keeps_serving(
    tmp_path: Path, host: Connection, topics: Topics, watcher: FleetWatcher, host_keys: HostKeys,
    demo_bundles: dict[str, Path], start_agent: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    bundle = demo_bundles["intel-x86-vnni"]
    manifest, _ = publish_bundle(host, topics, bundle)
    launched = start_agent("dev-l", env={"EDGEFLEET_LAUNCHER": str(tmp_path / "dev-l" / "launcher")})
    plain = start_agent("dev-plain")
    release_key, bundle_key = host_keys.release_key(), host_keys.bundle_key()

    # No launcher: no release is ever fetched.
    good = _offer(host, topics, _release(tmp_path, "0.9.0", release_key), release_key, host_keys)
    _want(host, topics, host_keys, bundle, "dev-plain", good)
    _refused(watcher, "dev-plain", "not started by edgefleet-launcher")

    # Under a launcher: the offer must be the release key's, above the floor, for this Python.
    forged = _offer(host, topics, _release(tmp_path, "0.9.1", release_key), bundle_key, host_keys)
    _want(host, topics, host_keys, bundle, "dev-l", forged)
    _refused(watcher, "dev-l", "untrusted key")
    older = _offer(host, topics, _release(tmp_path, "0.0.9", release_key), release_key, host_keys)
    _want(host, topics, host_keys, bundle, "dev-l", older)
    _refused(watcher, "dev-l", "not newer than 0.1.0")
    other = _offer(host, topics, _release(tmp_path, "0.9.2", release_key, python="3.9"), release_key, host_keys)
    _want(host, topics, host_keys, bundle, "dev-l", other)
    _refused(watcher, "dev-l", "is for Python 3.9")

    for device, agent in (("dev-l", launched), ("dev-plain", plain)):
        status = watcher.serving(device, manifest.bundle_id)
        assert status.agent_version == "0.1.0" and (status.agent_update or "").startswith("refused agent release")
        (answer,) = RemoteModel(host, topics, device).infer_many([{"input": np.zeros((1, 1, 8, 8), np.float32)}])
        assert answer.ok and agent.alive
    assert not (tmp_path / "dev-l" / "agent-releases").exists() or not any(
        (tmp_path / "dev-l" / "agent-releases").glob("*.part")
    ), "nothing was fetched"
