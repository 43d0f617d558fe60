"""Deltas with real agent processes on a real Mosquitto: a device that holds version N takes every chunk of N+1 it
already has from its installed bundle and fetches only the rest; a fresh device takes the same path with nothing
installed; a kill -9 in the middle resumes without fetching again what it had."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.core.messages import BundleOffer, Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, bundle_with

StartAgent = Callable[..., AgentProcess]
WEIGHTS = 1_500_000
DETAIL = re.compile(r"(\d+) bytes fetched in (\d+) chunks, (\d+) chunks \((\d+) bytes\) from installed bundles")


def versions(
    source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, seed: int, changed: list[int]
) -> tuple[Path, Path]:
    """Version N with a 1.5 MB weights file, and N+1 with 4 KiB of it changed at each offset in `changed` (the
    model itself, and so its golden set, stays the same)."""
    weights = bytearray(np.random.default_rng(seed).bytes(WEIGHTS))
    old = bundle_with(source, out, key, trusted, f"{seed}0", {"extra/weights.bin": bytes(weights)})
    for at in changed:
        weights[at : at + 4096] = np.random.default_rng(seed + at).bytes(4096)
    new = bundle_with(source, out, key, trusted, f"{seed}1", {"extra/weights.bin": bytes(weights)})
    return old, new


def fetched(event: Event) -> tuple[int, int, int, int]:
    """(bytes fetched, chunks fetched, chunks taken from installed bundles, their bytes) of a `downloaded` event."""
    match = DETAIL.search(event.detail)
    assert match, event.detail
    return int(match[1]), int(match[2]), int(match[3]), int(match[4])


def install(host: Connection, topics: Topics, bundle: Path, device: str) -> BundleOffer:
    manifest, offer = publish_bundle(host, topics, bundle)
    deploy(host, topics, manifest, devices=[device], groups=[])
    return offer


def test_a_device_holding_n_receives_n_plus_1_as_a_delta_and_commits_it(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    old, new = versions(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, 21, [300_000, 900_000])
    start_agent("dev-delta")
    first = install(host, topics, old, "dev-delta")
    watcher.serving("dev-delta", first.bundle_id)
    second = install(host, topics, new, "dev-delta")
    watcher.serving("dev-delta", second.bundle_id, timeout=60)
    watcher.event("dev-delta", "committed", bundle_id=second.bundle_id)
    wire, chunks, _, local_bytes = fetched(watcher.event("dev-delta", "downloaded", bundle_id=second.bundle_id))
    full = new.stat().st_size
    print(f"delta: {wire} of {full} bytes on the wire ({wire / full:.1%}), {chunks} chunks; {local_bytes} bytes local")
    assert wire < 0.15 * full, "two changed 4 KiB stretches cost a few chunks (9.2 % here), not the bundle"
    assert local_bytes > 0.85 * full
    assert chunks <= 12


def test_a_device_with_no_previous_version_gets_the_whole_bundle_through_the_same_path(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    _, new = versions(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, 22, [])
    start_agent("dev-fresh")
    offer = install(host, topics, new, "dev-fresh")
    watcher.serving("dev-fresh", offer.bundle_id, timeout=60)
    wire, chunks, local, _ = fetched(watcher.event("dev-fresh", "downloaded", bundle_id=offer.bundle_id))
    distinct = {ref.sha256: ref for ref in offer.transfer.chunks}
    assert local == 0 and chunks == len(distinct)
    assert wire == sum(ref.zstd or ref.size for ref in distinct.values())
    assert wire <= new.stat().st_size


def test_a_kill_9_in_the_middle_of_a_delta_resumes_fetching_only_what_it_lacked(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    """Two chunks of N+1 are withheld (their retained messages cleared), so the delta is caught in the middle for
    sure: the agent holds everything else when it is killed. After the restart it fetches the two and nothing more
    (a resume may re-fetch at most one chunk)."""
    changed = [100_000, 400_000, 700_000, 1_000_000, 1_300_000]
    old, new = versions(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, 23, changed)
    agent = start_agent("dev-kill-delta")
    first = install(host, topics, old, "dev-kill-delta")
    watcher.serving("dev-kill-delta", first.bundle_id)
    manifest, offer = publish_bundle(host, topics, new)
    lacking = [ref for ref in offer.transfer.chunks if ref.sha256 not in {r.sha256 for r in first.transfer.chunks}]
    withheld = [ref for ref in lacking if ref.size > 16 * 1024][:2]
    assert len(withheld) == 2
    for ref in withheld:
        host.publish(topics.chunk(ref.sha256), b"", qos=1, retain=True, wait=5)
    deploy(host, topics, manifest, devices=["dev-kill-delta"], groups=[])
    record = agent.state_dir / "slots" / "default" / "downloads" / f"{offer.bundle_id}.part.blocks"
    total = len(offer.transfer.chunks)
    watcher.wait_for(
        "every chunk but the withheld two", lambda: record.exists() and sum(record.read_bytes()) == total - 2, 60
    )
    agent.kill9()
    held = sum(record.read_bytes())
    marker = len(watcher.events)
    publish_bundle(host, topics, new, republish=True)  # the withheld chunks are back
    agent.start()
    watcher.serving("dev-kill-delta", offer.bundle_id, timeout=90)
    resumed = next(e for e in watcher.events[marker:] if e.kind == "downloaded" and e.bundle_id == offer.bundle_id)
    wire, chunks, _, _ = fetched(resumed)
    assert held == total - 2
    assert chunks <= 2 + 1, f"the resume fetched {chunks} chunks; it lacked 2"
    assert wire <= sum(ref.size for ref in withheld) + max(ref.size for ref in offer.transfer.chunks)
    assert "resuming" in " ".join(e.detail for e in watcher.events[marker:] if e.kind == "download-started")
